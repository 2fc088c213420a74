"""Layer 2: trying again after transient failures (a backend marks them when it translates
them; it does not loop), clean-up that must happen eventually, and the record of server
sessions in doubt that a clean-up must end first."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Hashable
from typing import Any, Generic, TypeVar

from ._errors import BackendError
from ._types import monotonic
from ._wakeup import Backoff

__all__ = ["Guaranteed", "InDoubt", "Pauses", "ReadyWait", "RetryIf", "retrying"]

log = logging.getLogger("aiodlock")

T = TypeVar("T")
S = TypeVar("S", bound=Hashable)

#: ``wait_ready(end)``: True once the backend can be asked again, False at ``end`` (monotonic;
#: ``None``: no end) or if it never will (closed).
ReadyWait = Callable[[float | None], Awaitable[bool]]
RetryIf = Callable[[BackendError], bool]


def _transient(error: BackendError) -> bool:
    return error.transient


def _earlier(a: float | None, b: float | None) -> float | None:
    """The earlier of two ends (None: no end)."""
    return b if a is None else a if b is None else min(a, b)


class Pauses:
    """Capped, jittered pauses while failures last, for at most ``limit`` seconds from now."""

    __slots__ = ("_backoff", "_until")

    def __init__(
        self, limit: float | None = None, *, first: float = 0.05, cap: float = 1.0
    ) -> None:
        self._until = None if limit is None else monotonic() + limit
        self._backoff = Backoff(first=first, cap=cap)

    def end(self, deadline: float | None = None) -> float | None:
        return _earlier(self._until, deadline)

    def pause(self, error: BaseException, deadline: float | None = None) -> float:
        """How long to wait before the next try; raises ``error`` when the time is up."""
        end = self.end(deadline)
        pause = self._backoff.next()
        if end is not None:
            left = end - monotonic()
            if left <= 0:
                raise error
            pause = min(pause, left)
        return pause


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    until: float | None = None,
    limit: float | None = None,
    tries: int | None = None,
    what: str = "call",
    wait_ready: ReadyWait | None = None,
    retry_if: RetryIf | None = None,
    first: float = 0.05,
    cap: float = 1.0,
) -> T:
    """``await attempt()`` (idempotent), again after each failure ``retry_if`` picks (default:
    transient ones), after a :class:`Pauses` pause or, with ``wait_ready``, once the backend
    is ready.  It raises the last error past ``until``, once failures lasted ``limit``
    seconds (with ``wait_ready``: once one wait for readiness would outlast it), after
    ``tries`` runs, or when ``wait_ready`` answers False."""
    should_retry = retry_if or _transient
    pauses: Pauses | None = None
    runs = 0
    while True:
        try:
            return await attempt()
        except BackendError as error:
            runs += 1
            if not should_retry(error) or (tries is not None and runs >= tries):
                raise
            if wait_ready is not None:
                end = _earlier(None if limit is None else monotonic() + limit, until)
                log.debug("aiodlock: %s: %s; trying again when the server is back", what, error)
                if not await wait_ready(end):
                    raise
                continue
            if pauses is None:
                pauses = Pauses(limit, first=first, cap=cap)
            pause = pauses.pause(error, until)
            log.debug("aiodlock: %s: %s; trying again in %.3f s", what, error, pause)
            await asyncio.sleep(pause)


class Guaranteed:
    """Clean-up actions that must succeed eventually (after Curator's guaranteed delete), and
    the owner's background tasks.  What :meth:`run` could not do in time is kept for ONE
    background task: it waits for ``wait_ready``, runs each kept action once, then pauses
    (``pauses``: first, cap) or until :meth:`kick`.  An action is dropped once it returns;
    while the owner lives it is never given up (unexpected failures are logged)."""

    def __init__(
        self,
        what: str = "clean-up",
        *,
        wait_ready: ReadyWait | None = None,
        retry_if: RetryIf | None = None,
        pauses: tuple[float, float] = (0.05, 1.0),
    ) -> None:
        self.what = what
        self._wait_ready = wait_ready
        self._retry_if = retry_if or _transient
        self._first, self._cap = pauses
        self._pending: dict[Hashable, Callable[[], Awaitable[object]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._kicked = asyncio.Event()
        #: key -> done when the background's run of its action ends
        self._running: dict[Hashable, asyncio.Future[None]] = {}
        self.closed = False

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._pending

    async def run(
        self, key: Hashable, action: Callable[[], Awaitable[T]], *, until: float | None
    ) -> T:
        """:func:`retrying` ``action`` until ``until``; on failure keep it under ``key``."""
        try:
            return await retrying(
                action,
                until=until,
                what=self.what,
                wait_ready=self._wait_ready,
                retry_if=self._retry_if,
                first=self._first,
                cap=self._cap,
            )
        except BaseException:
            self.later(key, action)
            raise

    def later(self, key: Hashable, action: Callable[[], Awaitable[object]]) -> bool:
        """Keep ``action`` for the background task.  False: closed, or ``key`` is kept."""
        if self.closed or key in self._pending:
            return False
        self._pending[key] = action
        if self._task is None:
            self._task = self.spawn(self._background(), f"aiodlock:{self.what}")
        else:
            self._kicked.set()
        return True

    async def forget(self, key: Hashable) -> None:
        """Whatever ``key`` stands for is about to be used again: drop its kept action (once
        the background's run of it under way, if any, has ended: it must not run on after
        this returns, it could undo what follows)."""
        while (running := self._running.get(key)) is not None:
            await asyncio.wait([running])
        self._pending.pop(key, None)

    def kick(self) -> None:
        """The server is back (or may be): run what is kept now."""
        self._kicked.set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Start a task of the owner's that :meth:`aclose` cancels and awaits."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Stop: drop what is kept, cancel the background task and the owner's tasks."""
        self.closed = True
        self._pending.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._task = None

    async def _background(self) -> None:
        backoff = Backoff(first=self._first, cap=self._cap)
        try:
            while self._pending and not self.closed:
                self._kicked.clear()
                if self._wait_ready is not None and not await self._wait_ready(None):
                    return  # it never will be (closed)
                if await self._run_kept():
                    backoff.reset()
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff.next()):
                        await self._kicked.wait()
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    async def _run_kept(self) -> bool:
        """Run every kept action once; True when none failed."""
        ok = True
        for key, action in list(self._pending.items()):
            if self._pending.get(key) is not action:
                continue  # (settled meanwhile)
            running = self._running[key] = asyncio.get_running_loop().create_future()
            try:
                await action()
            except Exception as error:
                ok = False
                expected = isinstance(error, BackendError) and (
                    error.transient or self._retry_if(error)
                )
                if not expected:
                    log.warning(
                        "aiodlock: %s %r failed; trying again", self.what, key, exc_info=True
                    )
                continue
            finally:
                del self._running[key]
                running.set_result(None)
            if self._pending.get(key) is action:
                del self._pending[key]
        return ok


class InDoubt(Generic[S]):
    """The server sessions whose call was cut short (cancelled, timed out, its answer lost),
    each with when it was noted.  Closing the connection does not stop the server: a
    statement sent just before may still run, and commit, after a later clean-up has read
    what it would change, and the clean-up would then miss it.  So a pool notes each such
    session, and before a clean-up the backend ends them and waits until the server has (its
    own protocol): each one's fate is then sealed.  At most ``keep`` are kept, the newest
    (``None``: no bound)."""

    __slots__ = ("_noted",)

    def __init__(self, keep: int | None = None) -> None:
        self._noted: collections.deque[tuple[S, float]] = collections.deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._noted)

    def note(self, session: S) -> None:
        """Keep ``session`` (the oldest one goes when there are ``keep`` already)."""
        self._noted.append((session, monotonic()))

    def recent(self, within: float | None = None) -> list[S]:
        """The sessions noted in the last ``within`` seconds (``None``: all), oldest first."""
        since = None if within is None else monotonic() - within
        return [session for session, at in self._noted if since is None or at >= since]

    def forget(self, sessions: Collection[S] | None = None) -> None:
        """Forget ``sessions`` (``None``: all): their fate is sealed, or they are too old to
        be told apart from a later session that got the same identity."""
        if sessions is None:
            self._noted.clear()
        else:
            gone = set(sessions)
            kept = [(session, at) for session, at in self._noted if session not in gone]
            self._noted = collections.deque(kept, maxlen=self._noted.maxlen)

    def take(self, within: float | None = None) -> list[S]:
        """:meth:`recent` ``(within)``, and forget every one (the older ones too)."""
        sessions = self.recent(within)
        self.forget()
        return sessions
