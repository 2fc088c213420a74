"""Redlock's quorum: one node's connection and standing, the fan-out, the counting of votes.

A node that has not answered a fan-out in time counts as a :class:`~aiodlock.BackendTimeout`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from ..._errors import BackendTimeout, describe
from ..._types import monotonic
from ..._wakeup import Timer
from ._pubsub import PubSubHub
from ._scripts import memo
from ._wire import Link, OnReply, ScriptCall, wire_error

#: A node's answer in a fan-out: the decoded reply, or a :class:`BackendError` (a
#: :class:`BackendTimeout` when it did not answer in time).
Outcome = Any

NO_ANSWER: Final = object()


class Node:
    """One Redis master: its pipelined link, its pub/sub hub, its standing."""

    __slots__ = ("_silent", "counts_after", "hub", "index", "label", "link", "secrets")

    def __init__(self, index: int, address: str, secrets: tuple[str, ...]) -> None:
        self.index, self.secrets = index, secrets
        self.label = f"redlock node {address}"
        #: Monotonic time from which this node's votes count (``rejoin_delay``).
        self.counts_after = -math.inf
        self.link: Link
        self.hub: PubSubHub
        # NOTE: one exception per kind: a fan-out decided by a majority leaves the slower
        # nodes "unanswered" on every lock operation, and formatting one each time is a
        # measurable part of an uncontended acquire.
        self._silent: Callable[[tuple[str, float]], BackendTimeout] = memo(
            lambda k: BackendTimeout(f"{self.label}: {k[0]}: no answer within {k[1]:g} s"), 64
        )

    def counts(self, now: float) -> bool:
        return now >= self.counts_after

    def outcome(self, reply: Any, what: str, timeout: float) -> Outcome:
        """``reply`` as a fan-out reports it (failures translated, silence a timeout)."""
        if reply is NO_ANSWER:
            return self._silent((what, timeout))
        if isinstance(reply, BaseException):
            return wire_error(self.label, reply, what, self.secrets)
        return reply


class Quorum:
    """Sends one request to every node at once and gathers the answers (a fan-out)."""

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
    ) -> list[Outcome]:
        """Send ``request`` to every node; one :data:`Outcome` each.  Waits until every node
        answered, at most ``timeout``; with ``patience``, that long for all of them, then
        only until ``decided(replies so far)``."""
        gather = Gather(len(nodes), decided)
        self.start(nodes, request, gather)
        await self.finish(gather, timeout=timeout, patience=patience)
        return self.outcomes(nodes, gather.replies, what, timeout)

    def start(
        self,
        nodes: Sequence[Node],
        request: ScriptCall | list[ScriptCall] | Callable[[Node, OnReply], None],
        gather: Gather,
    ) -> None:
        """The sending half: one script call for every node, one per node, or
        ``request(node, deliver)``; node ``i`` answers to ``gather.deliver(i, reply)``."""
        deliver = gather.deliver
        for index, node in enumerate(nodes):
            if type(request) is ScriptCall:
                node.link.eval(request, functools.partial(deliver, index))
            elif type(request) is list:
                node.link.eval(request[index], functools.partial(deliver, index))
            else:
                request(node, functools.partial(deliver, index))  # type: ignore[operator]

    def finish(
        self, gather: Gather, *, timeout: float, patience: float | None = None
    ) -> Awaitable[None]:
        """The waiting half (what to await: one coroutine less per lock operation)."""
        loop = asyncio.get_running_loop()
        started = monotonic()
        if patience is None or patience >= timeout or not gather.decidable:
            return gather.until(self.expiries(loop, timeout), started + timeout, armed=False)
        if patience > 0:
            return self._patiently(gather, loop, started, patience, timeout)
        return gather.until(self.expiries(loop, timeout), started + timeout, armed=True)

    async def _patiently(
        self,
        gather: Gather,
        loop: asyncio.AbstractEventLoop,
        started: float,
        patience: float,
        timeout: float,
    ) -> None:
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
        return [node.outcome(r, what, timeout) for node, r in zip(nodes, replies, strict=True)]

    def errors(self, outcomes: Sequence[Outcome]) -> str:
        failed = [describe(o, self.secrets) for o in outcomes if isinstance(o, BaseException)]
        return "; ".join(failed) or "no error"


class Gather:
    """The replies of one fan-out, and the one future its caller sleeps on; ``decided``
    (given the replies so far) ends the wait early once ``armed``."""

    __slots__ = ("armed", "decidable", "decided", "left", "replies", "waiter")

    def __init__(self, n: int, decided: Callable[[list[Any]], bool] | None = None) -> None:
        self.replies: list[Any] = [NO_ANSWER] * n
        self.left = n
        self.waiter: asyncio.Future[None] | None = None
        self.decided = decided
        self.decidable = decided is not None
        self.armed = False

    def deliver(self, index: int, reply: Any) -> None:
        if self.replies[index] is NO_ANSWER:
            self.replies[index] = reply
            self.left -= 1
            waiter = self.waiter
            if waiter is not None and not waiter.done() and (not self.left or self.enough()):
                waiter.set_result(None)

    def enough(self) -> bool:
        """Decided (once ``armed``: before, only every answer ends the wait)."""
        return self.armed and self.decided is not None and self.decided(self.replies)

    async def until(self, queue: Expiries, deadline: float, *, armed: bool) -> None:
        """Until every node answered, it is decided (when ``armed``), or ``deadline``."""
        self.armed = armed
        if not self.left or self.enough() or deadline <= monotonic():
            return
        self.waiter = waiter = queue.loop.create_future()
        queue.add(deadline, waiter)
        try:
            await waiter
        finally:
            self.waiter = None


class Votes(Gather):
    """The two hot fan-outs, counted inline as the replies come: an acquire's (a yes is a
    token from a node whose votes count, kept in ``tokens``; anything else a no) and a
    release's (1 is a yes, 0 a no, a failure neither).  Decided once ``need`` said yes or
    more than ``spare`` said no.  NOTE: one class for both: on Python 3.11 the attribute
    look-ups of a method that sees two classes in turn lose their specialization (measured
    at +5% instructions per Redlock cycle)."""

    __slots__ = ("after", "need", "no", "spare", "tokens", "yes")

    def __init__(
        self, n: int, need: int, *, acquire: bool, after: Sequence[float] | None = None
    ) -> None:
        # (Gather.__init__ written out: two of these are made per lock cycle)
        self.replies: list[Any] = [NO_ANSWER] * n
        self.left = n
        self.waiter: asyncio.Future[None] | None = None
        self.decidable = True
        self.armed = False
        self.need = need
        self.spare = n - need
        self.yes = self.no = 0
        #: Per node, from when its votes count (``None``: every node counts).
        self.after = after
        #: An acquire's tokens by node (None for a release).
        self.tokens: dict[int, int] | None = {} if acquire else None

    def enough(self) -> bool:
        return self.armed and (self.yes >= self.need or self.no > self.spare)

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
            if type(reply) is not int or reply < 1:  # (busy, an error or no connection)
                self.no += 1
            else:
                tokens[index] = reply
                after = self.after
                if after is None or after[index] <= monotonic():
                    self.yes += 1
                else:
                    self.no += 1
        waiter = self.waiter
        if waiter is not None and not waiter.done() and (not self.left or self.enough()):
            waiter.set_result(None)


class Expiries:
    """Wakes the fan-outs of one timeout when their time is up, with ONE loop timer: they
    expire in the order they started, so a FIFO of their deadlines is enough."""

    __slots__ = ("entries", "loop", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: collections.deque[tuple[float, asyncio.Future[None]]] = collections.deque()
        self.timer = Timer(self._due)

    def add(self, deadline: float, waiter: asyncio.Future[None]) -> None:
        entries = self.entries
        # (drop the finished ones at the front; a long wait there makes the rest pile up:
        # sweep them now and then)
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


def answered(replies: Sequence[Any]) -> int:
    """How many nodes answered (replies or outcomes: failures and silence do not count)."""
    return sum(1 for r in replies if r is not NO_ANSWER and not isinstance(r, BaseException))
