"""The shared try-then-wait loop and the wake-up sources a waiter sleeps on.

The loop (:func:`acquire_loop`) is the policy; a backend supplies one atomic attempt
(``try_acquire``) and a wake-up source (``waiter``).  The waiter is entered BEFORE the
retry that precedes each sleep, so a release that happens between a failed attempt and the
sleep is never missed.

:class:`WakeupBoard` is the per-client table of local waiters by name: a backend that hears
of a release (a pub/sub message, a same-process release) wakes ONE local waiter, not all.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import anyio

from ._errors import BackendError
from .backends._base import Busy, Grant, Request, Waiter, monotonic

if TYPE_CHECKING:
    from .backends._base import Backend

log = logging.getLogger("aiodlock")

__all__ = [
    "Backoff",
    "BackoffWaiter",
    "BoardWaiter",
    "Reservations",
    "Wakeup",
    "WakeupBoard",
    "acquire_loop",
]


async def acquire_loop(
    backend: Backend,
    request: Request,
    deadline: float | None,
    first: Busy | None = None,
    first_sent: float | None = None,
) -> Grant | None:
    """Try, then sleep on the backend's waiter and retry until granted or ``deadline``.

    ``first``: the answer of a first attempt the caller already made, which it started at
    ``first_sent`` (monotonic; None if unknown).
    """
    if first is None:
        first_sent = monotonic()
        result = await backend.try_acquire(
            request, will_wait=deadline is None or deadline > monotonic()
        )
        if isinstance(result, Grant):
            return result
        first = result
    if deadline is not None and monotonic() >= deadline:
        if request.fair:
            await backend.abandon(request)
        return None
    granted: Grant | None = None
    try:
        context = backend.waiter(request)
        waiter = await _enter_waiter(context, deadline)
        if waiter is None:
            return None  # the deadline passed while the waiter was being set up
        # NOTE: what ``async with context`` does, spelled out: no coroutine or exit stack
        # of its own per wait (this is every contended acquisition's path).
        try:
            busy = _still_busy(waiter, first, first_sent)
            outage: _Outage | None = None
            while True:
                if busy is None:
                    # NOTE: the waiter is live here, so a release after this attempt wakes us.
                    try:
                        result = await backend.try_acquire(request, will_wait=True)
                    except BackendError as exc:
                        if not exc.transient:
                            raise
                        if outage is None:
                            outage = _Outage(request.ttl)
                        # (raises exc when the outage outlasts the deadline or the lease)
                        pause = outage.pause(exc, deadline)
                        log.debug(
                            "aiodlock: waiting for %r: %s; trying again in %.3f s",
                            request.name,
                            exc,
                            pause,
                        )
                        await waiter.wait(pause)
                        continue
                    outage = None
                    if isinstance(result, Grant):
                        granted = result
                        break
                    busy = result
                remaining = math.inf if deadline is None else deadline - monotonic()
                if remaining <= 0:
                    break
                await waiter.wait(_sleep_for(busy, remaining))
                busy = None
        except BaseException as exc:
            await context.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await context.__aexit__(None, None, None)
        return granted
    finally:
        if not granted and request.fair:
            # A fair backend keeps a queue entry between attempts: drop it (shielded, as
            # this may run because the task was cancelled).
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await backend.abandon(request)


async def _enter_waiter(
    context: AbstractAsyncContextManager[Waiter], deadline: float | None
) -> Waiter | None:
    """Enter the waiter ``context``, at most until ``deadline``.

    Setting a waiter up can take a round trip or more (a subscription confirmed by the
    server, a watch); it must not stretch ``timeout=X`` beyond X.  None: the deadline
    passed first (what the set-up had done is undone by its own clean-up: a context
    manager whose ``__aenter__`` fails is not entered).
    """
    if deadline is None:
        return await context.__aenter__()
    loop = asyncio.get_running_loop()
    bound = asyncio.timeout_at(loop.time() + max(0.0, deadline - monotonic()))
    try:
        async with bound:
            return await context.__aenter__()
    except TimeoutError:
        if bound.expired():
            return None
        raise  # a timeout of the backend's own (BackendTimeout)


class _Outage:
    """A waiting acquire whose attempts fail with transient backend errors (the server
    unreachable, timing out, loading, failing over) tries again after capped, jittered
    pauses instead of giving up: a waiter should outlive a failover.  It gives up, raising
    the last error, when its deadline comes or when the failures have lasted as long as the
    lease it asks for (past that, every lease held through the outage is lost anyway, so
    it is no blip).

    NOTE: trying again is safe because an attempt is idempotent for its owner: one whose
    grant was made but whose answer was lost gets the same grant again; and if the loop
    gives up, the caller abandons whatever the attempts left on the server.
    """

    __slots__ = ("_backoff", "_until")

    def __init__(self, limit: float) -> None:
        self._until = monotonic() + limit
        self._backoff = Backoff(first=0.05, cap=1.0)

    def pause(self, error: BackendError, deadline: float | None) -> float:
        """How long to wait before the next attempt; raises ``error`` when it is over."""
        now = monotonic()
        end = self._until if deadline is None else min(self._until, deadline)
        pause = min(self._backoff.next(), end - now)
        if pause <= 0:
            raise error
        return pause


def _still_busy(waiter: Waiter, first: Busy, sent: float | None) -> Busy | None:
    """``first`` (what remains of it) when it needs no second ask, else None.

    A waiter that says it has been listening since before the first attempt was sent
    (``listening_since``) has been woken by any release since that attempt: asking again
    before the first sleep would learn nothing (a wake-up already there ends that sleep at
    once).  Unless the holder's lease has run out meanwhile.
    """
    since: float | None = getattr(waiter, "listening_since", None)
    if sent is None or since is None or since > sent:
        return None
    if first.retry_after is None:
        return first
    left = first.retry_after - (monotonic() - sent)
    return Busy(left) if left > 0 else None


def _sleep_for(result: Busy, remaining: float) -> float | None:
    limit = remaining
    if result.retry_after is not None:
        # Wake when the holder's lease would run out, even if no release message comes.
        limit = min(limit, max(result.retry_after, 0.0) + 0.001)
    return None if math.isinf(limit) else limit


class Backoff:
    """Capped exponential backoff with full jitter (AWS style), for polling backends."""

    def __init__(self, first: float = 0.005, cap: float = 0.25, factor: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.factor = factor
        self._next = first

    def next(self) -> float:
        delay = random.uniform(self._next / 2, self._next)
        self._next = min(self.cap, self._next * self.factor)
        return delay

    def reset(self) -> None:
        self._next = self.first


class BackoffWaiter:
    """A waiter that only polls (with :class:`Backoff`)."""

    #: (see :class:`~aiodlock.backends._base.Waiter`: a poller never listens)
    listening_since: float | None = None

    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()

    @classmethod
    @contextlib.asynccontextmanager
    async def context(cls, backoff: Backoff | None = None) -> AsyncIterator[BackoffWaiter]:
        yield cls(backoff)

    async def wait(self, timeout: float | None) -> None:
        delay = self.backoff.next()
        await anyio.sleep(delay if timeout is None else min(delay, timeout))


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Wakeup:
    """A wake-up flag that ONE task at a time waits on, with an optional time limit.

    What :class:`asyncio.Event` does for a waiter's slot, without the list of waiters, and a
    timed wait without :func:`asyncio.timeout` (no cancellation of the task, one timer): a
    slot is waited on by its own task only, once per contended acquisition.
    """

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            future = self._future
            if future is not None and not future.done():
                future.set_result(None)

    async def wait(self, timeout: float | None = None) -> None:
        """Return once set, or after ``timeout`` seconds (``None``: no limit)."""
        if self._set:
            return
        if self._future is not None:
            raise RuntimeError("a Wakeup is waited on by one task at a time")
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, future)
        try:
            await future
        finally:
            self._future = None
            if timer is not None:
                timer.cancel()


class _Slot:
    """One local waiter's place on a :class:`WakeupBoard`."""

    __slots__ = ("event", "key", "name")

    def __init__(self, name: str = "", key: int = 0) -> None:
        self.event = Wakeup()
        self.name = name
        self.key = key


class WakeupBoard:
    """Local waiters by name, woken one at a time.

    ``wake_one(name)`` sets the event of the oldest waiter that has no pending wake-up; a
    waiter that leaves with an unconsumed wake-up passes it on, so a wake-up is never lost
    because its receiver timed out or was cancelled.
    """

    def __init__(self) -> None:
        self._slots: dict[str, collections.OrderedDict[int, _Slot]] = {}
        self._seq = 0

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def names(self) -> list[str]:
        return list(self._slots)

    def count(self, name: str) -> int:
        slots = self._slots.get(name)
        return len(slots) if slots else 0

    @contextlib.contextmanager
    def register(self, name: str) -> Iterator[_Slot]:
        """A place for one waiter of ``name`` while inside (:meth:`add`, :meth:`remove`)."""
        slot = self.add(name)
        try:
            yield slot
        finally:
            self.remove(slot)

    def add(self, name: str) -> _Slot:
        """A new waiter of ``name``, the last in line; :meth:`remove` it when it leaves."""
        self._seq += 1
        slot = _Slot(name, self._seq)
        slots = self._slots.get(name)
        if slots is None:
            slots = self._slots[name] = collections.OrderedDict()
        slots[slot.key] = slot
        return slot

    def remove(self, slot: _Slot) -> None:
        """The waiter leaves; a wake-up it did not consume goes to the next one."""
        name = slot.name
        slots = self._slots.get(name)
        if slots is not None:
            slots.pop(slot.key, None)
            if not slots:
                del self._slots[name]
        if slot.event.is_set():
            self.wake_one(name)

    def wake_one(self, name: str) -> bool:
        slots = self._slots.get(name)
        if not slots:
            return False
        for slot in slots.values():
            if not slot.event.is_set():
                slot.event.set()
                return True
        return False

    def wake_all(self, name: str) -> None:
        for slot in list(self._slots.get(name, {}).values()):
            slot.event.set()

    def wake_everyone(self) -> None:
        for name in list(self._slots):
            self.wake_all(name)


class Reservations:
    """Hand-off reservations: after a release by this process woke ONE local waiter of a
    name, the next attempt on that name is that waiter's for up to ``window`` seconds.

    Without it another local task (typically the releasing task, asking again at once)
    would race the woken waiter with a round trip of its own and usually win, so local
    waiters would starve behind a task that loops on the lock.  The window only bounds the
    stall when the woken waiter is gone; its attempt ends the reservation at once.  One
    per backend, keyed by whatever names a lock there.
    """

    __slots__ = ("_until", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def __contains__(self, name: str) -> bool:
        return name in self._until

    def reserve(self, name: str) -> None:
        """A release by this process woke (or its message will wake) a waiter of ``name``."""
        self._until[name] = monotonic() + self.window

    def active(self, name: str) -> bool:
        """Is the next attempt on ``name`` reserved right now?"""
        until = self._until.get(name)
        return until is not None and until > monotonic()

    def bar(self, name: str, woken: bool) -> float | None:
        """Seconds an attempt on ``name`` must wait for the reserved one, or None: it may go.

        ``woken``: the attempt is a woken waiter's, which may always go (and must
        :meth:`end` the reservation once its attempt is answered).
        """
        until = self._until.get(name)
        if until is None or woken:
            return None
        left = until - monotonic()
        if left > 0:
            return left
        del self._until[name]
        return None

    def end(self, name: str) -> None:
        """The reserved attempt was made."""
        self._until.pop(name, None)


class BoardWaiter:
    """A waiter woken through a :class:`WakeupBoard`, optionally also polling with backoff.

    ``backoff=None`` means purely event-driven (the timeout passed to :meth:`wait` still
    bounds the sleep, e.g. the holder's remaining lease).
    """

    #: (see :class:`~aiodlock.backends._base.Waiter`: a board hears this process only)
    listening_since: float | None = None

    def __init__(self, slot: _Slot, backoff: Backoff | None) -> None:
        self._slot = slot
        self._backoff = backoff

    @classmethod
    @contextlib.asynccontextmanager
    async def context(
        cls, board: WakeupBoard, name: str, backoff: Backoff | None = None
    ) -> AsyncIterator[BoardWaiter]:
        with board.register(name) as slot:
            yield cls(slot, backoff)

    async def wait(self, timeout: float | None) -> None:
        if self._backoff is not None:
            delay = self._backoff.next()
            timeout = delay if timeout is None else min(delay, timeout)
        slot = self._slot
        await slot.event.wait(timeout)
        if slot.event.is_set():
            # Consume the wake-up: the next sleep waits for a new one.
            slot.event = Wakeup()
            if self._backoff is not None:
                self._backoff.reset()
