"""``connect()`` and :class:`Client`: the backend's life, owners, the table of holds, and the
policy (reentrancy, deadlines, lost leases, cancellation); backends only speak their protocol."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import re
import socket
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import anyio

from ._checks import check_name
from ._errors import (
    BackendError,
    BackendTimeout,
    ConfigurationError,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
)
from ._hold import Hold, OnLost
from ._local import LocalWaiters
from ._observers import Observer, notify
from ._registry import load_backend
from ._retry import Guaranteed
from ._shield import finish
from ._types import Capability, CommonConfig, Grant, LockStatus, Request, monotonic
from ._url import parse_url, sqlite_url, take_float, take_str
from ._waiting import acquire_loop
from ._wakeup import InFlight
from ._watchdog import Watchdog
from .backends._base import Backend

if TYPE_CHECKING:
    from ._decorators import LockedDecorator
    from ._lock import Lock

__all__ = ["Client", "OnLost", "connect", "default_url"]

log = logging.getLogger("aiodlock")


@functools.cache
def _lock_type() -> type[Lock]:
    """:class:`~aiodlock.Lock` (a layer above: imported on first use, once)."""
    from ._lock import Lock

    return Lock


_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_UNRELEASED = "unless the server did it, the lock stays held until its lease ends"
_CLEANUP = "clean-up of an interrupted acquire"


def default_url() -> str:
    """``AIODLOCK_URL`` if set, else the embedded SQLite file in the user cache dir."""
    url = os.environ.get("AIODLOCK_URL")
    if url:
        return url
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return sqlite_url(os.path.join(os.path.abspath(cache), "aiodlock", "locks.db"))


def connect(url: str | None = None, **options: Any) -> Client:
    """Make a :class:`Client` for ``url`` (no I/O yet; ``None``: :func:`default_url`).  Options
    are keyword arguments or URL query parameters (keyword arguments win); a bad URL or option
    raises :class:`ConfigurationError` naming it."""
    parsed = parse_url(default_url() if url is None else url)
    backend_cls = load_backend(parsed.scheme)
    merged: dict[str, Any] = {**parsed.query, **options}
    backend = backend_cls.from_url(parsed, _common_config(merged), merged)
    if merged:
        names = ", ".join(sorted(repr(k) for k in merged))
        raise ConfigurationError(
            f"unknown option(s) {names} for the {backend_cls.backend_name} backend"
        )
    return Client(backend)


def _common_config(options: dict[str, Any]) -> CommonConfig:
    namespace = take_str(options, "namespace", "aiodlock")
    if namespace is None or not _NAMESPACE_RE.match(namespace):
        raise ConfigurationError(
            f"option 'namespace' must be 1-64 characters of letters, digits and _ . : -, "
            f"got {namespace!r}"
        )
    watchdog_ttl = take_float(options, "watchdog_ttl", 30.0, minimum=0.03)
    connect_timeout = take_float(options, "connect_timeout", 5.0, allow_zero=False)
    op_timeout = take_float(options, "op_timeout", 5.0, allow_zero=False)
    return CommonConfig(namespace, watchdog_ttl, connect_timeout, op_timeout)


def _make_client_id() -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class Client:
    """A connection to one lock service, made by :func:`aiodlock.connect`.  Use it as ``async
    with client:`` or call :meth:`open` / :meth:`close` (a new client used before it is opened
    opens itself).  It belongs to the event loop that opened it."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._config = backend.config
        self._default_acquire = type(backend).acquire is Backend.acquire
        self._local = LocalWaiters(backend)
        #: A unique string per client instance; owners are ``f"{id}:{n}"`` (a task) and
        #: ``f"{id}/{key}"`` (``owner=key``): the id has neither ``:`` nor ``/``
        #: (:func:`~aiodlock._types.client_of` reads it back).
        self.id: str = _make_client_id()
        self._holds: dict[tuple[str, str], Hold] = {}
        self._holding: dict[str, int] = {}  # owner -> how many of _holds are its
        #: A task's owner, by a weak reference to the task (looked up with a plain
        #: ``weakref.ref(task)``: one Python call less than a WeakKeyDictionary).
        self._owners: dict[weakref.ref[asyncio.Task[Any]], str] = {}
        # (drops the entry of a freed task; refers to the dict only, not to the client)
        self._owner_gone = functools.partial(dict.pop, self._owners)
        self._owner_seq = 0
        #: (name, owner) -> done when that ``owner=`` key's acquire in flight ends.
        self._claims: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # (the loop that opened it)
        self._state: Literal["new", "open", "closing", "closed"] = "new"
        #: Tasks inside acquire() past the open check, and those close() cancelled.
        self._acquiring = InFlight()
        self._ended_by_close: set[asyncio.Task[Any]] = set()
        self._releasing = InFlight()  # holds being released on the server (close() waits)
        self._open_lock = asyncio.Lock()
        self._watchdog = Watchdog(
            backend, self.id, self.spawn, self._mark_lost, self._holds.__len__
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._observers: list[Observer] = []
        #: (name, owner) -> the clean-up of an interrupted acquire that could not be done in
        #: time (the server did not answer): done in the background while the client is
        #: open, and before that owner asks for that name again.
        self._cleanups = Guaranteed(_CLEANUP)

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def config(self) -> CommonConfig:
        return self._config

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def __repr__(self) -> str:
        return f"<aiodlock.Client id={self.id!r} {self._backend.describe()} {self._state}>"

    async def open(self) -> None:
        """Connect (idempotent).  Raises :class:`BackendError` if the server is unreachable."""
        self._here()
        if self._state == "open":
            return
        if self._state == "closing":
            raise LockError("the client is closing; open it again once close() has returned")
        async with self._open_lock:
            if self.is_open:  # opened by another task meanwhile
                return
            try:
                with anyio.fail_after(self._config.connect_timeout):
                    await self._backend.open(self._on_backend_lost)
            except BaseException as exc:
                await finish(self._close_backend("aclose after a failed open failed"))
                if isinstance(exc, TimeoutError) and not isinstance(exc, LockError):
                    raise BackendTimeout(
                        f"{self._backend.backend_name}: could not connect to "
                        f"{self._backend.describe()} within {self._config.connect_timeout} s"
                    ) from exc
                raise
            if self._state == "closed":
                self._watch_tasks(True)  # (re-opened: watch the known tasks again)
            self._state = "open"
            self._loop = asyncio.get_running_loop()
            self._watchdog.start()

    async def close(self) -> None:
        """End every wait (with :class:`LockError`), release every lock (a body still running
        sees its lease lost), disconnect; a closed client refuses acquisitions until reopened."""
        self._here()
        if self._state != "open":
            return
        self._state = "closing"
        # (a task's end callback would keep a closed client alive as long as the task)
        self._watch_tasks(False)
        # (to its end, even if the caller is cancelled again meanwhile: see _shield)
        await finish(self._shut_down(asyncio.current_task()))

    async def _shut_down(self, current: asyncio.Task[Any] | None) -> None:
        # NOTE: in this order: the waits end (each cleans up through the open backend),
        # then the holds are released (no local waiter is left to hand one to), and the
        # backend closes once the releases begun by cancelled tasks are through.
        for task in self._acquiring:
            assert isinstance(task, asyncio.Task)
            if task is not current and not task.done():
                self._ended_by_close.add(task)
                task.cancel("aiodlock: the client was closed")
        await self._acquiring.drained(self._config.op_timeout * 3)
        holds = [h for h in self._holds.values() if not h.server_released]
        for hold in holds:
            self._mark_lost(hold, "the client was closed while the lock was held")
        for hold in holds:
            await self._server_release(hold)
        await self._releasing.drained(self._config.op_timeout)
        await self._watchdog.stop()
        await self._cleanups.aclose()  # (what is left there ends with its lease)
        self._cleanups = Guaranteed(_CLEANUP)  # (a reopened client may be in another loop)
        self._local.clear()
        ours = [task for task in self._tasks if task is not current]  # (not the closer)
        for task in ours:
            task.cancel()
        for task in ours:
            with contextlib.suppress(BaseException):
                await task
        try:
            await self._close_backend("closing the backend failed", logged=logging.WARNING)
        finally:
            self._state = "closed"
            self._loop = None
            self._open_lock = asyncio.Lock()  # (the next open may be in another loop)

    async def _close_backend(self, failed: str, logged: int = logging.DEBUG) -> None:
        try:
            with anyio.move_on_after(self._config.op_timeout):
                await self._backend.aclose()
        except Exception:
            log.log(logged, "aiodlock: %s", failed, exc_info=True)

    def _watch_tasks(self, on: bool) -> None:
        """Add or remove the task-end callback of every live task that has an owner here."""
        for ref in list(self._owners):
            task = ref()
            if task is not None and not task.done():
                (task.add_done_callback if on else task.remove_done_callback)(self._task_ended)

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _here(self) -> None:
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            self._wrong_loop()

    def _wrong_loop(self) -> NoReturn:
        raise LockError(
            "this client was opened in another event loop (a second asyncio.run(), or a "
            "fixture's loop that is not the test's) and belongs to that loop: open a "
            "client in the loop that uses it, or run the coroutine in the client's loop "
            "(asyncio.run_coroutine_threadsafe)"
        )

    async def _ensure_open(self) -> None:
        self._here()
        if self._state != "open":
            if self._state != "new":
                raise LockError(f"the client is {self._state}: call open() to use it again")
            await self.open()

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run ``coro`` as a background task owned by this client (cancelled on close)."""

        async def runner() -> None:
            try:
                await coro
            except Exception:
                log.exception("aiodlock: background task %s failed", name)

        task = asyncio.get_running_loop().create_task(runner(), name=f"aiodlock:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def add_observer(self, observer: Observer) -> None:
        """Send lock events (acquired, released, lost, timeout) to ``observer``."""
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        self._observers.remove(observer)

    def lock(
        self,
        name: str,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        fair: bool = False,
        on_lost: OnLost = "cancel",
        owner: str | None = None,
    ) -> Lock:
        """A handle on the lock ``name`` (no I/O).  See :class:`aiodlock.Lock`."""
        lock_type = _lock_type()
        return lock_type(
            self, name, ttl=ttl, timeout=timeout, fair=fair, on_lost=on_lost, owner=owner
        )

    def locked(
        self,
        key: str | Callable[..., str],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        fair: bool = False,
        on_lost: OnLost = "cancel",
    ) -> LockedDecorator:
        """Decorate an ``async def`` so every call runs under the lock named by ``key``: a
        :meth:`str.format` template filled from the call's arguments by parameter name
        (``"report:{user_id}"``, ``"{order.id}"``), or a callable of the same arguments."""
        from ._decorators import LockedDecorator

        lock = functools.partial(self.lock, ttl=ttl, timeout=timeout, fair=fair, on_lost=on_lost)
        return LockedDecorator(key, lock)

    async def status(self, name: str) -> LockStatus | None:
        """Who holds ``name`` right now (in any process), or ``None``."""
        check_name(name)
        await self._ensure_open()
        return await self._backend.status(name)

    async def force_release(self, name: str) -> bool:
        """Break the lock ``name`` whoever holds it (an admin operation); True if a lock was
        released.  The holder notices at its next renewal at the latest."""
        check_name(name)
        await self._ensure_open()
        released = await self._backend.force_release(name)
        for hold in list(self._holds.values()):
            if hold.name == name and hold.active:
                self._mark_lost(hold, "the lock was force-released")
        return released

    def _owner_of(self, task: asyncio.Task[Any]) -> str:
        owner = self._owners.get(weakref.ref(task))
        if owner is None:
            self._owner_seq += 1
            owner = f"{self.id}:{self._owner_seq}"
            self._owners[weakref.ref(task, self._owner_gone)] = owner
            # One callback per task (not per hold): it releases what the task still holds.
            if self._state in ("new", "open"):  # (else they are watched once reopened)
                task.add_done_callback(self._task_ended)
        return owner

    def current_hold(self, name: str, key: str | None = None) -> Hold | None:
        """The holding of ``name`` by ``owner=key``, or else by the calling task."""
        if key is not None:
            owner: str | None = f"{self.id}/{key}"
        else:
            task = asyncio.current_task()
            owner = None if task is None else self._owners.get(weakref.ref(task))
        return None if owner is None else self._holds.get((name, owner))

    async def acquire(
        self, lock: Lock, timeout: float | None, task: asyncio.Task[Any] | None
    ) -> Hold:
        """``task``: the calling task, ``asyncio.current_task()`` (the caller has it: on
        Python 3.11 each call of it asks the kernel for the process id)."""
        if task is None:
            raise LockError("aiodlock locks must be used from inside an asyncio task")
        if self._loop is not None and task.get_loop() is not self._loop:
            self._wrong_loop()
        name, ttl, key = lock.name, lock.ttl, lock.owner  # (3 or fewer: no tuple is built)
        owner = self._owner_of(task) if key is None else f"{self.id}/{key}"
        while True:
            hold = self._holds.get((name, owner))
            if hold is not None and not hold.released:
                if hold.lost:
                    raise LockLost(
                        f"lock {name!r} was lost ({hold.lost_reason}); release it before "
                        f"acquiring it again"
                    )
                hold.count += 1  # reentrant: no round trip
                return hold
            claim = self._claims.get((name, owner)) if key is not None else None
            if claim is None:
                break
            # Another task of this owner key is acquiring: its hold is ours too, once it has it.
            await asyncio.wait([claim])
        if self._state != "open":
            await self._ensure_open()
        if self._cleanups:
            # The clean-up kept for an earlier, interrupted acquire of this owner: done later,
            # it could take away what this one gets; this acquire takes over what that one
            # may have left (an owner's own leftover is its own to take again or release).
            await self._cleanups.forget((name, owner))
        if key is not None:
            self._claims[(name, owner)] = asyncio.get_running_loop().create_future()
        backend = self._backend
        lease_ttl = ttl if ttl is not None else self._config.watchdog_ttl
        request = Request(name, owner, lease_ttl, lock.fair)
        started = monotonic()
        deadline = None if timeout is None else started + timeout
        self._acquiring.add(task)
        try:
            if self._default_acquire:
                # The core's loop: a first attempt, then acquire_loop's waiting.
                local = self._local
                will_wait = deadline is None or deadline > started
                if local.turns or local.reservations:
                    # (the client's own tasks first: a woken waiter's reservation, a turn)
                    first = await local.first(request, will_wait)
                else:
                    first = await backend.try_acquire(request, will_wait=will_wait)
                if isinstance(first, Grant):
                    grant: Grant | None = first
                else:
                    grant = await acquire_loop(backend, request, deadline, first, started, local)
            else:
                grant = await backend.acquire(request, deadline)
            if self._state != "open":
                # close() began as the answer came: give it back (below) and raise LockError.
                # close()'s cancellation of this task may still be on its way: take it here.
                if task in self._ended_by_close:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0)
                self._ended_by_close.add(task)
                raise asyncio.CancelledError
        except BaseException as exc:
            # The server may or may not have granted (a lost reply, a cancellation while
            # the reply was on its way): remove every trace of this owner's attempt.
            failure: BaseException = exc
            try:
                await self._abandon(request)
            except asyncio.CancelledError as again:  # (cancelled again while it ran)
                failure = again
            if isinstance(failure, asyncio.CancelledError) and task in self._ended_by_close:
                self._ended_by_close.discard(task)
                if task.uncancel() == 0:  # (no other cancellation pending: ours only)
                    raise LockError(f"the client was closed while acquiring {name!r}") from None
            if failure is not exc:
                raise failure from None
            raise
        finally:
            self._acquiring.discard(task)
            if key is not None:
                # (its other tasks wake at the next loop turn: the hold is registered by then)
                self._claims.pop((name, owner)).set_result(None)
        if grant is None:
            notify(self._observers, "on_timeout", name, owner, monotonic() - started)
            raise LockTimeout(f"lock {name!r} was not acquired within {timeout} s")
        # NOTE: no await from the grant to its hold: no cancellation can leave it untracked.
        hold = Hold(grant, lease_ttl, ttl is not None, lock.on_lost, lock.fair)
        if hold.fixed_ttl and hold.expires_at is None:
            # A session-bound grant has no end of its own: the core enforces a fixed ttl.
            hold.expires_at = monotonic() + lease_ttl
        self._holds[(name, owner)] = hold
        self._holding[owner] = self._holding.get(owner, 0) + 1
        self._watchdog.track(hold)
        if self._observers:
            notify(self._observers, "on_acquired", hold.lease, monotonic() - started)
        return hold

    async def _abandon(self, request: Request) -> None:
        if self._state == "closed":
            return  # (close() waits for the acquires in flight: a late one finds nothing)
        backend = self._backend

        async def clean_up() -> None:
            failure: object = "no answer in time"
            try:
                async with asyncio.timeout(self._config.op_timeout * 2):
                    await backend.abandon(request)
                return
            except TimeoutError:
                pass
            except Exception as exc:
                failure = exc
            msg = "aiodlock: could not clean up an interrupted acquire of %r (%s); trying "
            msg += "again in the background (while the client is open: else its lease ends it)"
            log.warning(msg, request.name, failure)
            self._cleanups.later((request.name, request.owner), lambda: backend.abandon(request))

        # (to its end, even if the task is cancelled again meanwhile: see _shield)
        await finish(clean_up())

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A task that used this client ended: release what it still holds (a bug of the
        caller's, but the lock must not stay taken until its lease ends)."""
        if self._state != "open":
            return
        owner = self._owners.get(weakref.ref(task))
        if owner is None or not self._holding.get(owner):
            return
        for hold in [h for h in self._holds.values() if h.owner == owner and not h.released]:
            msg = "aiodlock: task %r ended while holding lock %r; releasing it"
            log.warning(msg, task.get_name(), hold.name)
            self._forget(hold)
            self._watchdog.untrack(hold)  # (at once: its release runs later, in a task)
            self.spawn(self._server_release(hold), f"release-orphan:{hold.name}")

    def _forget(self, hold: Hold) -> None:
        hold.released = True
        hold.count = 0
        key = (hold.name, hold.owner)
        if self._holds.get(key) is hold:
            del self._holds[key]
            left = self._holding[hold.owner] - 1
            if left:
                self._holding[hold.owner] = left
            else:
                del self._holding[hold.owner]

    def _held(self, name: str, key: str | None) -> Hold:
        self._here()
        hold = self.current_hold(name, key)
        if hold is None:
            by = "this task" if key is None else f"owner {key!r}"
            raise LockNotOwned(f"lock {name!r} is not held by {by}")
        return hold

    def release(self, name: str, key: str | None = None) -> Awaitable[None]:
        """One release of ``name`` by ``owner=key``, or else by the calling task (not a
        coroutine: one less per release)."""
        return self.release_hold(self._held(name, key))

    async def release_hold(self, hold: Hold) -> None:
        # (no loop check here: release() made it, and an ``async with`` exits in the task,
        # so the loop, that entered it)
        name = hold.name
        hold.count -= 1
        if hold.count > 0:
            return
        # (the request leaves now if the backend can send it at once: the rest overlaps it)
        started = self._begin_server_release(hold)
        self._forget(hold)
        if self._observers:
            notify(self._observers, "on_released", hold.lease, monotonic() - hold.acquired_at)
        if started is not None:
            await self._server_release(hold, started)
        if hold.lost and hold.on_lost == "cancel":
            raise LockLost(f"lock {name!r} was lost while held: {hold.lost_reason}")

    def _begin_server_release(self, hold: Hold) -> Awaitable[bool] | None:
        """Start releasing ``hold`` on the server (once: None if that was done already)."""
        if hold.server_released:
            return None
        hold.server_released = True
        self._watchdog.untrack(hold)
        return self._local.start_release(hold.grant, hold.fair)

    async def _server_release(self, hold: Hold, started: Awaitable[bool] | None = None) -> None:
        """Release ``hold`` on the server once, even if cancelled; ``started`` (by
        release_hold): its caller gets a BackendError."""
        raise_errors = started is not None
        if started is None:
            started = self._begin_server_release(hold)
            if started is None:
                return
        self._releasing.add(hold)
        try:
            if not await started and not hold.lost:
                self._mark_lost(
                    hold,
                    "the lease had already expired or been taken over at release",
                    at_release=True,
                )
        except BackendError as error:
            log.warning("aiodlock: releasing %r failed (%s); %s", hold.name, error, _UNRELEASED)
            if raise_errors and not hold.lost:
                raise
        except BaseException:
            # Cancelled half-way: the compare-and-delete is idempotent, so do it again,
            # bounded and to its end (even if cancelled again), then let the cancellation go on.
            await finish(self._release_again(hold))
            raise
        finally:
            self._releasing.discard(hold)
            if hold.released:
                hold.end()  # the holding is over: break the cycle

    async def _release_again(self, hold: Hold) -> None:
        try:
            async with asyncio.timeout(self._config.op_timeout):
                await self._backend.release(hold.grant)
        except TimeoutError:
            log.warning("aiodlock: releasing %r timed out; %s", hold.name, _UNRELEASED)
        except Exception:
            log.warning("aiodlock: releasing %r failed; %s", hold.name, _UNRELEASED, exc_info=True)

    async def extend(self, name: str, ttl: float | None, key: str | None = None) -> None:
        hold = self._held(name, key)
        if hold.lost:
            raise LockLost(f"lock {name!r} was lost: {hold.lost_reason}")
        if ttl is not None:
            hold.ttl = ttl
            if hold.fixed_ttl:
                hold.lease.ttl = ttl
        results = await self._backend.renew([hold.grant], hold.ttl)
        if hold.released:
            return
        if results[0] is None:
            self._mark_lost(hold, "the lease was gone when it was extended")
            raise LockLost(f"lock {name!r} was lost: {hold.lost_reason}")
        expires_at: float | None = results[0]
        if self._backend.capabilities & Capability.SESSION_LEASE and not hold.fixed_ttl:
            expires_at = None  # the session is the lease: it has no end to move
        self._watchdog.renewed(hold, expires_at)

    def _on_backend_lost(self, grants: Any, reason: str) -> None:
        for grant in grants:
            hold = self._holds.get((grant.name, grant.owner))
            if hold is not None and hold.grant is grant and hold.active:
                self._mark_lost(hold, reason)

    def _mark_lost(self, hold: Hold, reason: str, *, at_release: bool = False) -> None:
        """Apply the lock's ``on_lost`` policy once.  ``at_release``: the release found the
        lease gone, so the holding was not protected to its end: lost, though released."""
        if hold.lost or (hold.server_released and not at_release):
            return
        hold.lost_reason = reason
        hold.lost = True
        if hold.lost_event is not None:
            hold.lost_event.set()
        self._watchdog.untrack(hold)
        log.warning(
            "aiodlock: lock %r lost: %s", hold.name, reason, extra={"aiodlock_event": "lost"}
        )
        notify(self._observers, "on_lost", hold.lease, reason)
        policy = hold.on_lost
        if policy == "cancel" and hold.entries:
            # Cancel the body once, at the outermost level (asyncio.timeout style: the
            # level that requested it uncancels and turns it into LockLost).
            entry = hold.entries[0]
            if not entry.cancel_requested:
                entry.cancel_requested = True
                entry.task.cancel(f"aiodlock: the lease of {hold.name!r} was lost")
        elif callable(policy):
            try:
                result = policy(hold.lease)
                if inspect.isawaitable(result):
                    self.spawn(result, f"on_lost:{hold.name}")
            except Exception:
                log.exception("aiodlock: the on_lost callback of %r failed", hold.name)
        if self._backend.capabilities & Capability.SESSION_LEASE and self._state == "open":
            # A session-bound lock does not end by itself while the session lives.
            self.spawn(self._drop_lost(hold), f"drop-lost:{hold.name}")

    async def _drop_lost(self, hold: Hold) -> None:
        if not hold.server_released:
            hold.server_released = True
            with anyio.move_on_after(self._config.op_timeout * 2):
                await self._backend.release(hold.grant)
