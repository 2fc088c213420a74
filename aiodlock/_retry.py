"""Layer 2: trying an attempt again after transient failures, and clean-up that must happen.

:func:`retrying` wraps a whole attempt (kazoo's ``KazooRetry`` is the model), :class:`Pauses`
gives its capped, jittered pauses to a caller that sleeps its own way, and
:class:`Guaranteed` keeps clean-up that must happen eventually (Curator's
``delete().guaranteed()``).  A backend marks errors transient when it translates them; it
does not loop.  Nothing here is module-level state: a backend makes its own
:class:`Guaranteed` in ``open()`` and closes it in ``aclose()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, TypeVar

from ._errors import BackendError
from ._types import monotonic
from ._wakeup import Backoff

__all__ = ["Guaranteed", "Pauses", "ReadyWait", "RetryIf", "retrying"]

log = logging.getLogger("aiodlock")

T = TypeVar("T")

#: ``wait_ready(end)``: wait until the backend can be asked again (True) or until ``end``
#: (monotonic; ``None``: no end) passes or it never will (False: e.g. it was closed).
ReadyWait = Callable[[float | None], Awaitable[bool]]
#: Which failures are tried again; the default is :attr:`BackendError.transient`.
RetryIf = Callable[[BackendError], bool]


def _transient(error: BackendError) -> bool:
    return error.transient


class Pauses:
    """Capped, jittered pauses while failures last, until a deadline or a limit.

    ``limit`` (seconds, counted from when this object is made, i.e. the first failure)
    bounds how long failures may go on; :meth:`pause` also takes a deadline of the call.
    """

    __slots__ = ("_backoff", "_until")

    def __init__(
        self, limit: float | None = None, *, first: float = 0.05, cap: float = 1.0
    ) -> None:
        self._until = None if limit is None else monotonic() + limit
        self._backoff = Backoff(first=first, cap=cap)

    def end(self, deadline: float | None = None) -> float | None:
        """The earlier of the limit's end and ``deadline`` (None: neither)."""
        if self._until is None:
            return deadline
        return self._until if deadline is None else min(self._until, deadline)

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
    """``await attempt()``, run again while it raises a transient :class:`BackendError`.

    ``attempt`` must be safe to run again (idempotent, or able to find what an earlier run
    left).  It is run again after a pause of :class:`Pauses` (``first``, ``cap``; a
    ``first`` of 0 runs it again at once), or, with ``wait_ready``, as soon as
    ``wait_ready`` says the backend can be asked again.  It gives up and raises the last
    error when ``until`` (monotonic) has passed, when the failures have lasted ``limit``
    seconds (with ``wait_ready``: when one wait for readiness would outlast ``limit``,
    since a ready backend ends an outage), after ``tries`` runs, or when ``wait_ready``
    answers False.  ``retry_if`` picks the failures that are tried again (default: those
    marked :attr:`BackendError.transient`); everything else is raised at once.
    """
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
                end = None if limit is None else monotonic() + limit
                if until is not None:
                    end = until if end is None else min(end, until)
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
    """Clean-up actions that must succeed eventually, and the owner's background tasks.

    :meth:`run` runs an action now (tried again like :func:`retrying` until ``until``);
    if it has not succeeded by then, failed otherwise or was cancelled, the action is
    kept (:meth:`later`) and the error raised.  ONE background task runs what is kept:
    it waits until the backend is ready (``wait_ready``), runs every kept action once,
    and after a failure pauses (capped, jittered: ``pauses`` is ``(first, cap)``) or until
    :meth:`kick`.  An action is dropped when it returns: one that finds nothing left to
    do (the session that owned the node is gone) returns too.  Other failures than
    transient ones (or those ``retry_if`` picks) are logged as warnings and tried again
    all the same (a clean-up is never given up while the owner lives).  :meth:`aclose` cancels
    the background task and every task started with :meth:`spawn`, and awaits them.
    """

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
        #: ``(first, cap)`` of the pauses after failures (see :class:`Pauses`).
        self._first, self._cap = pauses
        self._pending: dict[Hashable, Callable[[], Awaitable[object]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._kicked = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._pending

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(
        self, key: Hashable, action: Callable[[], Awaitable[T]], *, until: float | None
    ) -> T:
        """Run ``action`` now, again after transient failures until ``until`` (monotonic).

        Whatever stops it short of success (time up, another failure, a cancellation)
        keeps it for the background under ``key`` and propagates.
        """
        done = False
        try:
            result = await retrying(
                action,
                until=until,
                what=self.what,
                wait_ready=self._wait_ready,
                retry_if=self._retry_if,
                first=self._first,
                cap=self._cap,
            )
            done = True
            return result
        finally:
            if not done:
                self.later(key, action)

    def later(self, key: Hashable, action: Callable[[], Awaitable[object]]) -> bool:
        """Keep ``action`` for the background task.  False: closed, or ``key`` is kept."""
        if self._closed or key in self._pending:
            return False
        self._pending[key] = action
        if self._task is None:
            self._task = self.spawn(self._background(), f"aiodlock:{self.what}")
        else:
            self._kicked.set()
        return True

    def kick(self) -> None:
        """The server is back (or may be): run what is kept now, without the pause."""
        self._kicked.set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Start a task of the owner's that :meth:`aclose` cancels and awaits."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Stop: drop what is kept, cancel the background task and the owner's tasks."""
        self._closed = True
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
            while self._pending and not self._closed:
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
            self._pending.pop(key, None)
        return ok
