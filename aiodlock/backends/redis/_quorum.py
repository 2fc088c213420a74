"""Redlock's quorum: one node's connection and standing, the fan-out, the counting of votes.

A fan-out sends one request to every node at once (each node over its ONE pipelined
:class:`~._wire.Link`: one write per node, one wake-up of the caller) and ends when every node
answered, when a majority decided, or when its time is up; a node that has not answered
then counts as a :class:`~aiodlock.BackendTimeout` (its reply is read and dropped when it
comes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final

from ..._errors import BackendError, BackendTimeout, describe, translating
from ..._types import monotonic
from ..._wakeup import Timer
from ._pubsub import PubSubHub
from ._scripts import Memo
from ._wire import WIRE_ERRORS, Link, OnReply, ScriptCall

Outcome = Any
"""A node's answer in a fan-out: the decoded reply, or a :class:`BackendError` (a
:class:`BackendTimeout` when it did not answer in time)."""


class Node:
    """One Redis master: its pipelined link, its pub/sub hub, its standing."""

    __slots__ = (
        "_silent",
        "address",
        "counts_after",
        "hub",
        "index",
        "label",
        "link",
        "secrets",
    )

    def __init__(self, index: int, address: str, secrets: tuple[str, ...]) -> None:
        self.index = index
        self.address = address
        self.secrets = secrets
        self.label = f"redlock node {address}"
        #: Monotonic time from which this node's votes count (``rejoin_delay``).
        self.counts_after = -math.inf
        self.link: Link
        self.hub: PubSubHub
        self._silent: Memo[tuple[str, float], BackendTimeout] = Memo(self._silence, limit=64)

    def counts(self, now: float) -> bool:
        return now >= self.counts_after

    def no_answer(self, what: str, timeout: float) -> BackendTimeout:
        """The outcome of a request this node did not answer in time (never raised here).

        NOTE: made once per kind: a fan-out that is decided by a majority leaves the slower
        nodes "unanswered" on every lock operation, and formatting a new exception each time
        is a measurable part of an uncontended acquire.
        """
        return self._silent((what, timeout))

    def _silence(self, kind: tuple[str, float]) -> BackendTimeout:
        return BackendTimeout(f"{self.label}: {kind[0]}: no answer within {kind[1]:g} s")

    @contextlib.contextmanager
    def translate(self, what: str) -> Iterator[None]:
        """The one place where this node's failures become aiodlock's exceptions."""
        with translating(self.label, WIRE_ERRORS, what=what, secrets=self.secrets):
            yield

    def error(self, exc: BaseException, what: str) -> BackendError:
        """``exc`` as :meth:`translate` maps it."""
        try:
            with self.translate(what):
                raise exc
        except BackendError as mapped:
            return mapped
        except BaseException as other:  # pragma: no cover - not a node failure
            return BackendError(f"{self.label}: {what} failed: {describe(other)}")
        raise AssertionError("unreachable")  # pragma: no cover

    def __repr__(self) -> str:
        return f"<redlock node {self.index} {self.address}>"


class Quorum:
    """Sends one request to every node at once and gathers the answers (a fan-out).

    Replies are counted as they come (:class:`Gather`, :class:`Votes`); the caller sleeps on
    one future, woken when every node answered, when the outcome is decided or when its
    time is up (one loop timer per timeout, shared by every fan-out of that timeout).
    """

    def __init__(self, quorum: int, secrets: tuple[str, ...]) -> None:
        self.quorum = quorum
        self.secrets = secrets
        #: timeout -> the fan-outs waiting that long (one loop timer per queue)
        self.queues: dict[float, Expiries] = {}

    async def __call__(
        self,
        nodes: Sequence[Node],
        request: ScriptCall | Callable[[Node, OnReply], None],
        *,
        what: str,
        timeout: float,
        patience: float | None = None,
        decided: Callable[[list[Any]], bool] | None = None,
        vote: Vote | None = None,
    ) -> list[Outcome]:
        """Send ``request(node, deliver)`` to every node at once; one :data:`Outcome` each.

        ``request`` may also be a :class:`ScriptCall`: every node runs that script.

        Waits until every node answered, at most ``timeout``.  With ``patience``, waits that
        long for all of them, then only until the fan-out is decided: by ``vote`` (a
        majority of the nodes said yes, or too many said no for a majority), or by
        ``decided(replies)`` (the replies so far: a reply, an exception or ``NO_ANSWER``).
        A node that has not answered by then gets a :class:`BackendTimeout` (its reply is
        read and dropped when it comes).
        """
        gather = Gather(len(nodes), vote, self.quorum if vote is not None else 0)
        if decided is not None:
            check = decided
            replies = gather.replies
            gather.check = lambda: check(replies)
            gather.decidable = True
        self.start(nodes, request, gather)
        await self.finish(gather, timeout=timeout, patience=patience)
        return self.outcomes(nodes, gather.replies, what, timeout)

    def start(
        self,
        nodes: Sequence[Node],
        request: ScriptCall | list[ScriptCall] | Callable[[Node, OnReply], None],
        gather: Gather,
    ) -> None:
        """The sending half of a fan-out: node ``i`` of ``nodes`` answers to
        ``gather.deliver(i, reply)`` (nothing is awaited).

        ``request``: one script call for every node, a list of them (one per node), or
        ``request(node, deliver)`` sending whatever it likes.
        """
        deliver = gather.deliver
        if type(request) is ScriptCall:
            for index, node in enumerate(nodes):
                node.link.eval(request, functools.partial(deliver, index))
        elif type(request) is list:
            for index, node in enumerate(nodes):
                node.link.eval(request[index], functools.partial(deliver, index))
        else:
            assert callable(request)
            for index, node in enumerate(nodes):
                request(node, functools.partial(deliver, index))

    def finish(
        self, gather: Gather, *, timeout: float, patience: float | None = None
    ) -> Awaitable[None]:
        """The waiting half: see :meth:`__call__` for ``timeout`` and ``patience``.

        (A plain function returning what to await: one coroutine less on every lock
        operation.)
        """
        loop = asyncio.get_running_loop()
        started = monotonic()
        if patience is None or patience >= timeout or not gather.decidable:
            return gather.until(self.expiries(loop, timeout), started + timeout, armed=False)
        if patience > 0:
            return self.patiently(gather, loop, started, patience, timeout)
        return gather.until(self.expiries(loop, timeout), started + timeout, armed=True)

    async def patiently(
        self,
        gather: Gather,
        loop: asyncio.AbstractEventLoop,
        started: float,
        patience: float,
        timeout: float,
    ) -> None:
        """Every answer for ``patience`` seconds, then only until decided."""
        await gather.until(self.expiries(loop, patience), started + patience, armed=False)
        await gather.until(self.expiries(loop, timeout), started + timeout, armed=True)

    def expiries(self, loop: asyncio.AbstractEventLoop, timeout: float) -> Expiries:
        """The queue of the fan-outs that wait ``timeout`` seconds at most."""
        queue = self.queues.get(timeout)
        if queue is None or queue.loop is not loop:
            if len(self.queues) > 64:  # (timeouts follow the lease lengths in use)
                self.queues = {t: q for t, q in self.queues.items() if q.entries}
            queue = self.queues[timeout] = Expiries(loop)
        return queue

    def outcomes(
        self, nodes: Sequence[Node], replies: Sequence[Any], what: str, timeout: float
    ) -> list[Outcome]:
        out: list[Outcome] = []
        for node, reply in zip(nodes, replies, strict=True):
            if reply is NO_ANSWER:
                # Not a failure of the driver: the node is slow, or the fan-out did not
                # need its answer (it comes later and is dropped).
                out.append(node.no_answer(what, timeout))
            elif isinstance(reply, BaseException):
                out.append(node.error(reply, what))
            else:
                out.append(reply)
        return out

    def errors(self, outcomes: Sequence[Outcome]) -> str:
        parts = [
            describe(outcome, self.secrets)
            for outcome in outcomes
            if isinstance(outcome, BaseException)
        ]
        return "; ".join(parts) or "no error"


NO_ANSWER: Final = object()


Vote = Callable[[int, Any], bool | None]
"""How one node's reply counts: yes (True), no (False) or neither (None)."""


class Gather:
    """The replies of one fan-out, and the one future its caller sleeps on.

    With a ``vote``, replies are counted as they come: the fan-out is decided once ``need``
    nodes said yes or more than ``spare`` said no (a majority either way).  The subclasses
    below count the two hot fan-outs (acquire, release) inline, without a vote function.
    """

    __slots__ = (
        "armed",
        "check",
        "counted",
        "decidable",
        "left",
        "need",
        "no",
        "replies",
        "spare",
        "vote",
        "waiter",
        "yes",
    )

    def __init__(self, n: int, vote: Vote | None = None, need: int = 0) -> None:
        self.replies: list[Any] = [NO_ANSWER] * n
        self.left = n
        self.waiter: asyncio.Future[None] | None = None
        self.check: Callable[[], bool] | None = None
        self.vote = vote
        #: Decided by the yes and no counts (else by ``check``, if any).
        self.counted = need > 0
        self.need = need
        self.spare = n - need
        self.yes = 0
        self.no = 0
        self.armed = False
        self.decidable = self.counted

    def deliver(self, index: int, reply: Any) -> None:
        if self.replies[index] is not NO_ANSWER:
            return
        self.replies[index] = reply
        self.left -= 1
        vote = self.vote
        if vote is not None:
            counted = vote(index, reply)
            if counted is True:
                self.yes += 1
            elif counted is False:
                self.no += 1
        if self.waiter is not None:
            self._settle()

    def _settle(self) -> None:
        """Wake the caller if every node answered or (once armed) the fan-out is decided."""
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if not self.left or self.enough():
            waiter.set_result(None)

    def enough(self) -> bool:
        """Decided (once ``armed``: before, only every answer ends the wait)."""
        if not self.armed:
            return False
        if self.counted:
            return self.yes >= self.need or self.no > self.spare
        return self.check is not None and self.check()

    async def until(self, queue: Expiries, deadline: float, *, armed: bool) -> None:
        """Until every node answered, the fan-out is decided (when ``armed``), or the loop
        time ``deadline`` (``queue`` wakes it then)."""
        self.armed = armed
        if not self.left:
            return
        # (what enough() says, written out: every fan-out passes here)
        if armed and (
            self.yes >= self.need or self.no > self.spare if self.counted else self.enough()
        ):
            return
        if deadline <= monotonic():
            return
        self.waiter = waiter = queue.loop.create_future()
        queue.add(deadline, waiter)
        try:
            await waiter
        finally:
            self.waiter = None


class Votes(Gather):
    """The two hot fan-outs, counted inline as the replies come (no vote function).

    - An acquire's (``acquire=True``): a yes is a token (the ACQUIRE script's usual integer
      answer, >= 1) from a node whose votes count; every other answer is a no.  ``tokens``
      keeps the token of every node that granted (counted or not).
    - A release's: 1 (released) is a yes, 0 (not ours) a no, a failure neither.

    NOTE: one class for both, not a subclass each: on Python 3.11 the attribute look-ups of
    shared methods lose their specialization when they see two classes in turn (a shared
    ``deliver`` calling a per-class judgement measured 5% more instructions per Redlock
    cycle than a ``deliver`` written out in each of two classes).
    """

    __slots__ = ("after", "first", "mixed", "tokens")

    def __init__(
        self, n: int, need: int, *, acquire: bool, after: Sequence[float] | None = None
    ) -> None:
        # (Gather.__init__ written out: two of these are made per lock cycle)
        self.replies: list[Any] = [NO_ANSWER] * n
        self.left = n
        self.waiter: asyncio.Future[None] | None = None
        self.check: Callable[[], bool] | None = None
        self.vote: Vote | None = None
        self.counted = self.decidable = True
        self.need = need
        self.spare = n - need
        self.yes = self.no = 0
        self.armed = False
        #: Per node, from when its votes count (``None``: every node counts).
        self.after = after
        #: An acquire's tokens by node (None for a release).
        self.tokens: dict[int, int] | None = {} if acquire else None
        #: The first token granted; did the nodes grant different tokens?
        self.first: int | None = None
        self.mixed = False

    def deliver(self, index: int, reply: Any) -> None:
        replies = self.replies
        if replies[index] is not NO_ANSWER:
            return
        replies[index] = reply
        self.left -= 1
        tokens = self.tokens
        if tokens is None:  # a release
            if reply == 1:
                self.yes += 1
            elif reply == 0:
                self.no += 1
        else:  # an acquire
            if type(reply) is not int:
                # An older table answer (see acquire_reply), an error or no connection.
                ok = not isinstance(reply, BaseException) and acquire_reply(reply)[0]
                reply = acquire_reply(reply)[1] if ok else 0
            if reply < 1:
                self.no += 1
            else:
                first = self.first
                if first is None:
                    self.first = reply
                elif reply != first:
                    self.mixed = True
                tokens[index] = reply
                after = self.after
                if after is None or after[index] <= monotonic():
                    self.yes += 1
                else:
                    self.no += 1
        waiter = self.waiter
        if (
            waiter is not None
            and (not self.left or (self.armed and (self.yes >= self.need or self.no > self.spare)))
            and not waiter.done()
        ):
            waiter.set_result(None)


class Expiries:
    """Wakes the fan-outs of one timeout when their time is up, with ONE loop timer.

    The fan-outs of one timeout expire in the order they started, so a FIFO of their
    deadlines and futures is enough: the timer fires for the oldest one still waiting, and
    one timer then serves every fan-out of a whole ``timeout`` window.
    """

    __slots__ = ("entries", "loop", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: collections.deque[tuple[float, asyncio.Future[None]]] = collections.deque()
        self.timer = Timer(self._due)

    def add(self, deadline: float, waiter: asyncio.Future[None]) -> None:
        entries = self.entries
        # Fan-outs end about in the order they start: drop the finished ones at the front
        # (a long wait at the front makes the rest pile up: sweep them now and then).
        while entries and entries[0][1].done():
            entries.popleft()
        if len(entries) >= 1024:
            self.entries = entries = collections.deque(e for e in entries if not e[1].done())
        entries.append((deadline, waiter))
        self.timer.at(deadline)

    def _due(self, now: float) -> float | None:
        entries = self.entries
        while entries:
            deadline, waiter = entries[0]
            if not waiter.done():
                if deadline > now:
                    return deadline
                waiter.set_result(None)
            entries.popleft()
        return None


def any_answer(index: int, reply: Any) -> bool | None:
    """Any answer counts: status and force_release need a majority of answers."""
    return None if isinstance(reply, BaseException) else True


def acquire_reply(reply: Any) -> tuple[bool, int]:
    """The ACQUIRE script's answer: ``(True, token)`` or ``(False, ms left on the holder's
    lease, -1 when unknown)``.

    NOTE: the script answers ``token`` (>= 1), ``-1 - pttl`` or ``0`` (see its header in
    ``_scripts``); the older ``{1, token}`` / ``{0, pttl}`` tables are read too.
    """
    if isinstance(reply, list):
        return reply[0] == 1, int(reply[1])
    value = int(reply)
    if value >= 1:
        return True, value
    return False, -1 - value if value < 0 else -1


def answered(replies: Sequence[Any]) -> int:
    """How many nodes answered (replies or outcomes: failures and silence do not count)."""
    return sum(1 for r in replies if r is not NO_ANSWER and not isinstance(r, BaseException))
