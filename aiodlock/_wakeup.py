"""Layer 1: what a waiting task sleeps on, :class:`Reservations`, :class:`InFlight`, THE
one-timer mechanism (:class:`Timer`) and a session-bound backend's keep-alive
(:class:`Heartbeat`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from typing import ClassVar

import anyio

from ._types import Waiter, monotonic

__all__ = [
    "Backoff",
    "BoardWaiter",
    "Heartbeat",
    "InFlight",
    "Reservations",
    "SharedBoard",
    "Slot",
    "Timer",
    "Wakeup",
    "WakeupBoard",
]


class Backoff:
    """Capped exponential backoff with full jitter (AWS style)."""

    def __init__(self, first: float = 0.005, cap: float = 0.25) -> None:
        self.first = first
        self.cap = cap
        self._next = first

    def next(self) -> float:
        delay = random.uniform(self._next / 2, self._next)
        self._next = min(self.cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.first


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Wakeup:
    """A wake-up flag that ONE task at a time waits on: an :class:`asyncio.Event` without the
    list of waiters, timed without cancelling the task."""

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    async def wait(self, timeout: float | None = None) -> None:
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


@dataclasses.dataclass(slots=True, eq=False)
class Slot:
    """One local waiter's place on a :class:`WakeupBoard`; ``tag`` names it in a wake-up
    meant for it alone."""

    name: str = ""
    tag: object = None
    event: Wakeup = dataclasses.field(default_factory=Wakeup)


class WakeupBoard:
    """Local waiters by name, woken one at a time (a leaving waiter passes on its wake-up);
    ``single``: one wake-up per name on its way at most (Redlock's nodes all announce one)."""

    def __init__(self, single: bool = False) -> None:
        self._slots: dict[str, dict[Slot, None]] = {}  # (an ordered set)
        self._single = single

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def names(self) -> list[str]:
        return list(self._slots)

    def count(self, name: str) -> int:
        return len(self._slots.get(name, ()))

    def add(self, name: str, tag: object = None) -> Slot:
        slot = Slot(name, tag)
        self._slots.setdefault(name, {})[slot] = None
        return slot

    def remove(self, slot: Slot) -> None:
        slots = self._slots.get(slot.name)
        if slots is not None:
            slots.pop(slot, None)
            if not slots:
                del self._slots[slot.name]
        if slot.event.is_set():
            self.wake_one(slot.name)

    def wake_one(self, name: str) -> bool:
        """Wake the oldest waiter of ``name`` with no wake-up on its way; True: one is."""
        for slot in self._slots.get(name, ()):
            if not slot.event.is_set():
                slot.event.set()
                return True
            if self._single:
                return True
        return False

    def wake_tagged(self, name: str, tag: object) -> bool:
        """Wake the waiter of ``name`` added with ``tag``, if it waits here."""
        for slot in self._slots.get(name, ()):
            if slot.tag == tag:
                slot.event.set()
                return True
        return False

    def wake_all(self, name: str) -> None:
        for slot in list(self._slots.get(name, ())):
            slot.event.set()


class InFlight:
    """What is under way (acquires, releases), and a bounded wait until none is left."""

    __slots__ = ("_idle", "_items")

    def __init__(self) -> None:
        self._items: set[object] = set()
        self._idle: asyncio.Event | None = None

    def __iter__(self) -> Iterator[object]:
        return iter(list(self._items))

    def add(self, item: object) -> None:
        self._items.add(item)

    def discard(self, item: object) -> None:
        self._items.discard(item)
        if not self._items and self._idle is not None:
            self._idle.set()

    async def drained(self, timeout: float) -> None:
        """Return once nothing is under way, or after ``timeout`` seconds."""
        if self._items:
            self._idle = asyncio.Event()
            with anyio.move_on_after(timeout):
                await self._idle.wait()
            self._idle = None


class Reservations:
    """After a local release woke ONE local waiter of a name, the next attempt on the name
    is that waiter's for up to ``window`` seconds (else the releasing task, asking again at
    once, would usually win and starve it); the woken waiter's attempt ends it."""

    __slots__ = ("_until", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def __contains__(self, name: str) -> bool:
        return name in self._until

    def reserve(self, name: str) -> None:
        self._until[name] = monotonic() + self.window

    def active(self, name: str) -> bool:
        until = self._until.get(name)
        return until is not None and until > monotonic()

    def bar(self, name: str, woken: bool) -> float | None:
        """Seconds an attempt on ``name`` must wait for the reserved one, or None: it may go
        (always when ``woken``: then :meth:`end` it once the attempt is answered)."""
        until = self._until.get(name)
        if until is None or woken:
            return None
        left = until - monotonic()
        if left > 0:
            return left
        del self._until[name]
        return None

    def end(self, name: str) -> None:
        self._until.pop(name, None)


class BoardWaiter(Waiter):
    """A waiter woken through its :class:`Slot`, polling with ``backoff`` (if any) while
    ``listening`` (if given) does not say that a release would reach it."""

    def __init__(
        self, slot: Slot, backoff: Backoff | None, listening: Callable[[], bool] | None = None
    ) -> None:
        self._slot = slot
        self._backoff = backoff
        self._listening = listening

    @classmethod
    @contextlib.asynccontextmanager
    async def context(
        cls, board: WakeupBoard, name: str, backoff: Backoff | None = None
    ) -> AsyncIterator[BoardWaiter]:
        slot = board.add(name)
        try:
            yield cls(slot, backoff)
        finally:
            board.remove(slot)

    def listening(self) -> bool:
        return self._listening is not None and self._listening()

    async def wait(self, timeout: float | None) -> bool:
        backoff = self._backoff
        if backoff is not None and not self.listening():
            delay = backoff.next()
            timeout = delay if timeout is None else min(delay, timeout)
        slot = self._slot
        await slot.event.wait(timeout)
        if not slot.event.is_set():
            return False
        slot.event = Wakeup()  # consumed: the next sleep waits for a new one
        if backoff is not None:
            backoff.reset()
        return True

    def wake(self) -> None:
        self._slot.event.set()


class Timer:
    """ONE loop timer for any number of deadlines (a timer per request would cost a heap push
    and a cancellation each): :meth:`at` arms it for the earliest asked; when it fires it
    calls ``due(now)``, which returns the next deadline or None."""

    __slots__ = ("_when", "due", "handle")

    def __init__(self, due: Callable[[float], float | None]) -> None:
        self.due = due
        self.handle: asyncio.TimerHandle | None = None
        self._when = 0.0

    def at(self, when: float) -> None:
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


class Heartbeat:
    """A session-bound backend's keep-alive: ONE task that sleeps, calls ``beat()`` and sleeps
    the seconds it returns, until it returns None or :meth:`stop`.  What a failed beat means
    (a retry sooner, a lost session) is the backend's protocol: ``beat`` handles it."""

    __slots__ = ("_beat", "_name", "_task")

    def __init__(self, beat: Callable[[], Awaitable[float | None]], name: str) -> None:
        self._beat, self._name = beat, name
        self._task: asyncio.Task[None] | None = None

    def start(self, delay: float) -> None:
        """The first beat after ``delay`` seconds (a running heartbeat goes on as it was)."""
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(delay), name=self._name)

    def stop(self) -> None:
        """No more beats (a beat under way is cancelled, unless it is the caller)."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def aclose(self) -> None:
        """:meth:`stop`, and wait until the task has ended."""
        task = self._task
        self.stop()
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(BaseException):
                await task

    async def _run(self, delay: float | None) -> None:
        me = asyncio.current_task()
        while delay is not None and self._task is me:
            await asyncio.sleep(max(0.0, delay))
            delay = await self._beat()


class SharedBoard:
    """A :class:`WakeupBoard` per resource (a database file) and event loop, shared by the
    backends of a process so that clients hear each other's releases at once, not at their
    next poll; a release with no waiter on its loop's board rings one on each other loop's.
    The registry is the core's one process-wide state; an entry lives while joined."""

    _registry: ClassVar[dict[Hashable, dict[asyncio.AbstractEventLoop, SharedBoard]]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        resource: Hashable,
        loop: asyncio.AbstractEventLoop,
        boards: dict[asyncio.AbstractEventLoop, SharedBoard],
    ) -> None:
        self.board = WakeupBoard()
        self._resource = resource
        self._loop = loop
        #: The boards of the resource, this one's included (the registry's entry: it stays
        #: while this board is in it).
        self._boards = boards
        self._users = 0

    @classmethod
    def join(cls, resource: Hashable) -> SharedBoard:
        """The board of ``resource`` on the running loop; :meth:`leave` it once when done."""
        loop = asyncio.get_running_loop()
        with cls._mutex:
            boards = cls._registry.setdefault(resource, {})
            shared = boards.get(loop)
            if shared is None:
                shared = boards[loop] = cls(resource, loop, boards)
            shared._users += 1
        return shared

    def leave(self) -> None:
        with self._mutex:
            self._users -= 1
            boards = self._registry.get(self._resource, {})
            if self._users <= 0 and boards.get(self._loop) is self:
                del boards[self._loop]
                if not boards:
                    del self._registry[self._resource]

    def wake_one(self, name: str) -> None:
        """Wake one waiter of ``name`` on this loop's board, or else one on each other's."""
        if self.board.wake_one(name) or len(self._boards) < 2:
            return  # (no other loop has joined: the common case costs no mutex)
        with self._mutex:
            others = [s for s in self._boards.values() if s is not self]
        for other in others:
            with contextlib.suppress(RuntimeError):  # (its loop closed without leaving)
                other._loop.call_soon_threadsafe(other.board.wake_one, name)
