"""``strategy="named"``: MySQL/MariaDB named locks (``GET_LOCK`` / ``RELEASE_LOCK``).

Every lock of a client lives on ONE holder connection (a server session): its death (a
restart, a network failure, a KILL) frees every lock of the client at once, so the backend
reports them all lost, as a ZooKeeper session's expiry does.  The server compares lock
names case-insensitively and limits them to 64 characters: the name sent is a hash of the
namespace and the lock name.  Tokens come from a counter table (never
reset), and ``aiodlock_holders`` records who holds what (for ``status``), checked against
``IS_USED_LOCK``: a row is believed only while its session holds the lock.

Queries on the holder connection run one at a time, shielded from the caller's
cancellation (a cancelled query would leave the connection, and so every lock, in an
unknown state); one that fails or overruns ``op_timeout`` ends the session.  A keep-alive
asks the server every ``watchdog_ttl / 3`` while something is held, so a dead session is
noticed within that.  A waiter polls (``GET_LOCK(name, 0)``) with capped backoff, and a
release in this process wakes a local waiter at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self, TypeVar

from ..._errors import BackendError
from ..._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LockStatus,
    LostCallback,
    Request,
    monotonic,
)
from ..._url import ParsedURL
from ..._wakeup import Heartbeat
from .._sql import encode_name
from .._sql_backend import PollingBackend
from ._driver import Connection, driver_errors, error_code
from ._holders import HOLDERS, KEY, holders_ddl, next_token, record_holder
from ._pool import is_lost, translate
from ._settings import Settings, connect

__all__ = ["NamedBackend"]

T = TypeVar("T")
log = logging.getLogger("aiodlock")

_STATUS = f"SELECT owner, token, session, IS_USED_LOCK(%s) FROM {HOLDERS} WHERE {KEY}"


def _server_error(exc: BaseException) -> bool:
    """An error the server answered with (the connection is still in a known state)."""
    code = error_code(exc)
    return code is not None and 1000 <= code < 2000


class _Retry:
    pass


_RETRY = _Retry()


class NamedBackend(PollingBackend):
    """Named locks on one server session per client."""

    backend_name = "mysql"
    capabilities = Capability.FENCING | Capability.CROSS_PROCESS | Capability.SESSION_LEASE

    def __init__(self, config: CommonConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.poll_min, self.poll_max = settings.poll_min, settings.poll_max
        self._conn: Connection | None = None
        self._session = 0  # the number of the holder connection's session (0: none yet)
        self._gate: asyncio.Lock | None = None
        self._held: dict[str, Grant] = {}
        self._on_lost: LostCallback | None = None
        self._interval = max(0.05, min(config.watchdog_ttl / 3, 10.0))
        self._heartbeat = Heartbeat(self._beat, "aiodlock:mysql-keepalive")
        self._closed = False

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(config, Settings.from_url(url, options))

    def describe(self) -> str:
        return self.settings.describe() + "?strategy=named"

    def server_name(self, name: str) -> str:
        """The name sent to GET_LOCK: 64 characters, the same for every client."""
        digest = hashlib.sha256(self.config.namespace.encode() + b"\0" + encode_name(name))
        return "aiodlock:" + digest.hexdigest()[:55]

    # -- the holder connection -------------------------------------------------------------------

    async def _on_session(
        self,
        what: str,
        fn: Callable[[Connection], Awaitable[T]],
        gone: T | _Retry = _RETRY,
    ) -> T:
        """Run ``fn`` on the holder connection, after the calls before it, to its end even if
        the caller is cancelled (then its effects are the caller's clean-up's to undo).

        When the connection turns out lost, the session is over (every lock reported lost)
        and the answer is ``gone``, or by default ``fn`` runs once more on a new session.
        """
        task = asyncio.ensure_future(self._guarded(what, fn, gone))
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _guarded(
        self, what: str, fn: Callable[[Connection], Awaitable[T]], gone: T | _Retry
    ) -> T:
        if self._gate is None or self._closed:
            raise BackendError("mysql: the client is not open (or was closed)")
        async with self._gate:
            with translate(what, self.settings.secrets):
                while True:
                    fresh = self._conn is None
                    if self._conn is None:
                        self._conn = await connect(self.settings, self.config)
                        self._session += 1
                    try:
                        async with asyncio.timeout(self.config.op_timeout):
                            return await fn(self._conn)
                    except BaseException as exc:
                        if _server_error(exc):
                            raise
                        self._end_session(f"the server session ended ({what} failed)")
                        if not is_lost(exc):
                            raise
                        if not isinstance(gone, _Retry):
                            return gone
                        if fresh:
                            raise

    def _end_session(self, reason: str) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        lost = list(self._held.values())
        self._held.clear()
        if lost and self._on_lost is not None:
            self._on_lost(lost, reason)
        for grant in lost:
            self._wake_one(grant.name)

    async def _beat(self) -> float | None:
        """The keep-alive: asks the holder session while it holds something (a dead one is
        found, and its locks reported lost, by :meth:`_guarded`)."""
        if self._closed:
            return None
        if self._held:
            try:
                await self._on_session("keep-alive", _ping)
            except BackendError as exc:
                log.debug("aiodlock: mysql keep-alive failed: %s", exc)
        return self._interval

    async def open(self, on_lost: LostCallback) -> None:
        if self._gate is not None and not self._closed:
            return
        self._closed = False
        self._on_lost = on_lost
        self._gate = asyncio.Lock()

        async def schema(conn: Connection) -> None:
            async with conn.cursor() as cursor:
                for statement in holders_ddl():
                    await cursor.execute(statement)

        await self._on_session("open", schema)
        s = self.settings
        self._join_board(("mysql-named", s.host, s.port, s.database))
        self._heartbeat.start(self._interval)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._heartbeat.stop()
        gate = self._gate
        if gate is not None:
            async with gate:  # after the call in flight
                self._end_session("the client was closed while the lock was held")
        self._leave_board()

    # -- the contract ---------------------------------------------------------------------------

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        name, owner = request.name, request.owner
        mine = self._held.get(name)
        if mine is not None:  # (one session holds it for every owner of this client)
            return mine if mine.owner == owner else Busy()
        lock = self.server_name(name)
        key = encode_name(name).hex()
        ns = self.config.namespace

        async def attempt(conn: Connection) -> Grant | Busy:
            mine = self._held.get(name)
            if mine is not None:
                return mine if mine.owner == owner else Busy()
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT GET_LOCK(%s, 0)", (lock,))
                (got,) = await cursor.fetchone()
                if got != 1:
                    return Busy()
                try:
                    token = await next_token(cursor, ns, key)
                    await record_holder(cursor, ns, key, owner, token, conn.thread_id())
                except BaseException:
                    await cursor.execute("SELECT RELEASE_LOCK(%s)", (lock,))
                    raise
            grant = Grant(name, owner, token, None, self._session)
            self._held[name] = grant
            return grant

        return await self._on_session("acquire", attempt)

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        """Check that the session still holds each lock (the session is the lease)."""
        started = monotonic()

        async def check(conn: Connection) -> list[float | None]:
            results: list[float | None] = []
            async with conn.cursor() as cursor:
                for grant in grants:
                    await cursor.execute(
                        "SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.server_name(grant.name),)
                    )
                    (ok,) = await cursor.fetchone()
                    ok = ok == 1 and self._held.get(grant.name) is grant
                    results.append(started + ttl if ok else None)
            return results

        return await self._on_session("renew", check, [None] * len(grants))

    async def _release(self, name: str, owner: str | None) -> bool:
        async def release(conn: Connection) -> bool:
            grant = self._held.get(name)
            if grant is None or (owner is not None and grant.owner != owner):
                return False
            del self._held[name]
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT RELEASE_LOCK(%s)", (self.server_name(name),))
                (released,) = await cursor.fetchone()
            return bool(released == 1)

        released = await self._on_session("release", release, False)
        self._wake_one(name)
        return released

    async def release(self, grant: Grant) -> bool:
        if self._held.get(grant.name) is not grant:
            return False
        return await self._release(grant.name, grant.owner)

    async def abandon(self, request: Request) -> None:
        await self._release(request.name, request.owner)

    async def status(self, name: str) -> LockStatus | None:
        key = encode_name(name).hex()

        async def read(conn: Connection) -> LockStatus | None:
            async with conn.cursor() as cursor:
                await cursor.execute(_STATUS, (self.server_name(name), self.config.namespace, key))
                row = await cursor.fetchone()
                if row is None:
                    return None
                owner, token, session, holder = row
                if holder is None or holder != session:
                    return None  # (a row left by a session that ended)
            return LockStatus(name, str(owner), int(token), None)

        return await self._on_session("status", read)

    async def force_release(self, name: str) -> bool:
        lock = self.server_name(name)

        async def force(conn: Connection) -> bool | Grant:
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT IS_USED_LOCK(%s), CONNECTION_ID()", (lock,))
                (holder, me) = await cursor.fetchone()
                if holder is None:
                    return False
                if holder == me:
                    await cursor.execute("SELECT RELEASE_LOCK(%s)", (lock,))
                    grant = self._held.pop(name, None)
                    return grant if grant is not None else True
                # Another session holds it: only ending that session frees it (with EVERY
                # lock of that client: it reports them all lost).
                try:
                    await cursor.execute("KILL CONNECTION %s", (int(holder),))
                except driver_errors() as exc:
                    if error_code(exc) == 1094:  # unknown thread: it ended
                        return True
                    raise
            return True

        outcome = await self._on_session("force_release", force)
        if isinstance(outcome, Grant):
            if self._on_lost is not None:
                self._on_lost([outcome], "force-released")
            outcome = True
        self._wake_one(name)
        return outcome


def _retrieve(task: asyncio.Future[Any]) -> None:
    """(a shielded call's failure is its caller's, who may have gone: never "unretrieved")"""
    if not task.cancelled():
        task.exception()


async def _ping(conn: Connection) -> None:
    async with conn.cursor() as cursor:
        await cursor.execute("SELECT 1")
        await cursor.fetchone()
