"""Layer 1: what a waiting task sleeps on, and the one timer a sleep needs.

* :class:`Wakeup`: a flag ONE task waits on, with an optional time limit (one future, one
  ``call_later``; no task cancellation);
* :class:`WakeupBoard`: a client's local waiters by name, woken one at a time, a wake-up
  never lost when its receiver leaves;
* :class:`Backoff`, :class:`BackoffWaiter`, :class:`BoardWaiter`: the waiters of backends
  that poll, or that hear of releases only inside this process;
* :class:`Reservations`: after a local release woke one local waiter, the next attempt on
  the name is that waiter's for a short window.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from typing import ClassVar

import anyio

from ._types import Waiter, monotonic

__all__ = [
    "Backoff",
    "BackoffWaiter",
    "BoardWaiter",
    "InFlight",
    "Reservations",
    "SharedBoard",
    "Slot",
    "Wakeup",
    "WakeupBoard",
]


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


class BackoffWaiter(Waiter):
    """A waiter that only polls (with :class:`Backoff`)."""

    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()

    @classmethod
    @contextlib.asynccontextmanager
    async def context(cls, backoff: Backoff | None = None) -> AsyncIterator[BackoffWaiter]:
        yield cls(backoff)

    async def wait(self, timeout: float | None) -> bool:
        delay = self.backoff.next()
        await anyio.sleep(delay if timeout is None else min(delay, timeout))
        return False


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


class Slot:
    """One local waiter's place on a :class:`WakeupBoard`."""

    __slots__ = ("event", "key", "name", "tag")

    def __init__(self, name: str = "", key: int = 0, tag: object = None) -> None:
        self.event = Wakeup()
        self.name = name
        self.key = key
        #: What names this waiter in a wake-up meant for it alone (see ``wake_tagged``).
        self.tag = tag


class WakeupBoard:
    """Local waiters by name, woken one at a time.

    ``wake_one(name)`` sets the event of the oldest waiter that has no pending wake-up; a
    waiter that leaves with an unconsumed wake-up passes it on, so a wake-up is never lost
    because its receiver timed out or was cancelled.
    """

    def __init__(self) -> None:
        self._slots: dict[str, collections.OrderedDict[int, Slot]] = {}
        self._seq = 0

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def names(self) -> list[str]:
        return list(self._slots)

    def count(self, name: str) -> int:
        slots = self._slots.get(name)
        return len(slots) if slots else 0

    @contextlib.contextmanager
    def register(self, name: str) -> Iterator[Slot]:
        """A place for one waiter of ``name`` while inside (:meth:`add`, :meth:`remove`)."""
        slot = self.add(name)
        try:
            yield slot
        finally:
            self.remove(slot)

    def add(self, name: str, tag: object = None) -> Slot:
        """A new waiter of ``name``, the last in line; :meth:`remove` it when it leaves."""
        self._seq += 1
        slot = Slot(name, self._seq, tag)
        slots = self._slots.get(name)
        if slots is None:
            slots = self._slots[name] = collections.OrderedDict()
        slots[slot.key] = slot
        return slot

    def remove(self, slot: Slot) -> None:
        """The waiter leaves; a wake-up it did not consume goes to the next one."""
        name = slot.name
        slots = self._slots.get(name)
        if slots is not None:
            slots.pop(slot.key, None)
            if not slots:
                del self._slots[name]
        if slot.event.is_set():
            self.wake_one(name)

    def wake_one(self, name: str, may_go: Callable[[object], bool] | None = None) -> bool:
        """Wake the oldest waiter of ``name`` with no wake-up on its way (and, given
        ``may_go``, whose tag it accepts)."""
        slots = self._slots.get(name)
        if not slots:
            return False
        for slot in slots.values():
            if not slot.event.is_set() and (may_go is None or may_go(slot.tag)):
                slot.event.set()
                return True
        return False

    def pending(self, name: str) -> bool:
        """Is a wake-up on its way to a waiter of ``name`` (set, not consumed yet)?"""
        slots = self._slots.get(name)
        return slots is not None and any(slot.event.is_set() for slot in slots.values())

    def wake_tagged(self, name: str, tag: object) -> bool:
        """Wake the waiter of ``name`` added with ``tag``, if it waits here."""
        slots = self._slots.get(name)
        if slots:
            for slot in slots.values():
                if slot.tag == tag:
                    slot.event.set()
                    return True
        return False

    def wake_all(self, name: str) -> None:
        for slot in list(self._slots.get(name, {}).values()):
            slot.event.set()

    def wake_everyone(self) -> None:
        for name in list(self._slots):
            self.wake_all(name)


class InFlight:
    """What is under way (acquires, releases), and a bounded wait until none is left."""

    __slots__ = ("_idle", "_items")

    def __init__(self) -> None:
        self._items: set[object] = set()
        self._idle: asyncio.Event | None = None

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[object]:
        return iter(list(self._items))

    def add(self, item: object) -> None:
        self._items.add(item)

    def discard(self, item: object) -> None:
        items = self._items
        items.discard(item)
        if not items and self._idle is not None:
            self._idle.set()

    async def drained(self, timeout: float) -> None:
        """Return once nothing is under way, or after ``timeout`` seconds."""
        if not self._items:
            return
        self._idle = asyncio.Event()
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        self._idle = None


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


class BoardWaiter(Waiter):
    """A waiter woken through a :class:`WakeupBoard`, optionally also polling with backoff.

    ``backoff=None`` means purely event-driven (the timeout passed to :meth:`wait` still
    bounds the sleep, e.g. the holder's remaining lease).  (It hears this process only.)
    """

    def __init__(self, slot: Slot, backoff: Backoff | None) -> None:
        self._slot = slot
        self._backoff = backoff

    def polling(self) -> bool:
        """Does the next sleep end at the next backoff step too (not only at a wake-up)?"""
        return self._backoff is not None

    @classmethod
    @contextlib.asynccontextmanager
    async def context(
        cls, board: WakeupBoard, name: str, backoff: Backoff | None = None
    ) -> AsyncIterator[BoardWaiter]:
        with board.register(name) as slot:
            yield cls(slot, backoff)

    async def wait(self, timeout: float | None) -> bool:
        backoff = self._backoff
        if backoff is not None and self.polling():
            delay = backoff.next()
            timeout = delay if timeout is None else min(delay, timeout)
        slot = self._slot
        await slot.event.wait(timeout)
        if not slot.event.is_set():
            return False
        # Consume the wake-up: the next sleep waits for a new one.
        slot.event = Wakeup()
        if backoff is not None:
            backoff.reset()
        return True

    def wake(self) -> None:
        self._slot.event.set()


class Timer:
    """ONE loop timer for any number of deadlines (on :func:`monotonic`).

    :meth:`at` arms it for the earliest deadline asked so far (a later one costs a
    comparison); when it fires it calls ``due(now)``, which handles whatever is due and
    returns the next deadline, or None to rest until :meth:`at` is called again.  ``handle``
    is None while it rests (a caller whose deadlines only grow need not call :meth:`at`
    while it is armed).  A timer
    per request (armed, then cancelled when the answer comes a fraction of a millisecond
    later) costs a heap push and a cancellation each time; this costs one per earliest
    deadline.
    """

    __slots__ = ("_when", "due", "handle")

    def __init__(self, due: collections.abc.Callable[[float], float | None]) -> None:
        self.due = due
        self.handle: asyncio.TimerHandle | None = None
        self._when = 0.0

    def at(self, when: float) -> None:
        """Fire at ``when`` at the latest."""
        handle = self.handle
        if handle is not None:
            if when >= self._when:
                return
            handle.cancel()
        self._when = when
        loop = asyncio.get_running_loop()
        self.handle = loop.call_at(loop.time() + max(0.0, when - monotonic()), self._fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        self.handle = None
        when = self.due(monotonic())
        if when is not None:
            self.at(when)


class SharedBoard:
    """A :class:`WakeupBoard` that the backends of one process share per resource.

    Two clients of one process on one database file (say) hear each other's releases at
    once through it, instead of at their next poll, also when they run in two event loops
    (threads): each loop has its board, and a release that finds no waiter on its own
    loop's board rings one waiter on each other loop's, thread-safely.  The core keeps
    these boards, not the backends: it is the core's one process-wide registry (by
    resource, then by loop); an entry lives while a backend that joined it has not left.
    """

    _registry: ClassVar[dict[Hashable, dict[asyncio.AbstractEventLoop, SharedBoard]]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, resource: Hashable, loop: asyncio.AbstractEventLoop) -> None:
        self.board = WakeupBoard()
        self._resource = resource
        self._loop = loop
        self._users = 0

    @classmethod
    def join(cls, resource: Hashable) -> SharedBoard:
        """The board of ``resource`` on the running loop; :meth:`leave` it once when done."""
        loop = asyncio.get_running_loop()
        with cls._mutex:
            boards = cls._registry.setdefault(resource, {})
            shared = boards.get(loop)
            if shared is None:
                shared = boards[loop] = cls(resource, loop)
            shared._users += 1
        return shared

    def leave(self) -> None:
        """One backend that joined leaves (call it once per join)."""
        with self._mutex:
            self._users -= 1
            boards = self._registry.get(self._resource, {})
            if self._users <= 0 and boards.get(self._loop) is self:
                del boards[self._loop]
                if not boards:
                    del self._registry[self._resource]

    def wake_one(self, name: str) -> None:
        """Wake one waiter of ``name`` on this loop's board, or else one on each other's."""
        if self.board.wake_one(name):
            return
        with self._mutex:
            others = [s for s in self._registry.get(self._resource, {}).values() if s is not self]
        for other in others:
            with contextlib.suppress(RuntimeError):  # (its loop closed without leaving)
                other._loop.call_soon_threadsafe(other.board.wake_one, name)
