"""``strategy="row"``: the exclusive row lock, ``SELECT ... FOR UPDATE`` in an open transaction.

Each name has a row in ``aiodlock_rows`` (inserted on first use).  To hold the name, a
connection of its own begins a transaction and locks the row ``FOR UPDATE``, and keeps the
transaction open until the release (ROLLBACK).  Waiting is the server's: ``FOR UPDATE WAIT
n`` (MariaDB >= 10.3), ``NOWAIT`` for a try-lock; the server queues the waiters.  A holder
whose connection dies (a crash, a restart) frees the row at once, and a holder that finds
its connection dead has lost the lock.

The cost the design documents warn of: every holder AND every waiter keeps a connection of
its own (and a server thread).  Short calls (tokens, the holders table, ``status``) use the
pool; a waiter that gives up has its query killed (``KILL QUERY``), so that the server does
not grant the row to a connection nobody listens to.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
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
from .._base import Backend
from .._sql import encode_name
from ._driver import Connection, Cursor, driver_errors, load
from ._holders import HOLDERS, KEY, holders_ddl, next_token, record_holder
from ._pool import ConnectionPool, Run, is_retryable, translate
from ._settings import Settings, connect

__all__ = ["RowBackend"]

T = TypeVar("T")

ROWS = "aiodlock_rows"
_ROWS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {ROWS} ("
    " namespace VARBINARY(64) NOT NULL,"
    " name VARBINARY(2048) NOT NULL,"
    " PRIMARY KEY (namespace, name)"
    ") ENGINE=InnoDB"
)
# (not INSERT IGNORE: its duplicate-key warning would cost a SHOW WARNINGS)
_ENSURE_ROW = (
    f"INSERT INTO {ROWS} (namespace, name) VALUES (%s, UNHEX(%s)) "
    "ON DUPLICATE KEY UPDATE name = name"
)
_ROW_EXISTS = f"SELECT 1 FROM {ROWS} WHERE {KEY}"
_LOCK_ROW = f"SELECT 1 FROM {ROWS} WHERE {KEY} FOR UPDATE"
#: The longest single server-side wait of an acquire without a deadline (it waits again).
_WAIT_CHUNK = 3600


@dataclasses.dataclass(slots=True)
class _Holder:
    """The connection whose open transaction holds a row lock."""

    conn: Connection
    gate: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class RowBackend(Backend):
    """Row locks held by open transactions, one connection per holder and per waiter."""

    backend_name = "mysql"
    capabilities = Capability.FENCING | Capability.CROSS_PROCESS | Capability.SESSION_LEASE

    def __init__(self, config: CommonConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self._is_closed = load(settings.driver).is_closed
        self._pool: ConnectionPool | None = None
        self._holding: dict[tuple[str, str], Grant] = {}  # Grant.data: its _Holder
        self._spare: list[Connection] = []  # of holds that ended cleanly
        self._on_lost: LostCallback | None = None
        self._interval = max(0.05, min(config.watchdog_ttl / 3, 10.0))
        self._heartbeat = Heartbeat(self._beat, "aiodlock:mysql-rows")

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(config, Settings.from_url(url, options))

    def describe(self) -> str:
        return self.settings.describe() + "?strategy=row"

    def _key(self, name: str) -> str:
        return encode_name(name).hex()

    async def _pooled(self, what: str, fn: Callable[[Cursor], Awaitable[T]]) -> T:
        """``fn(cursor)`` on a pooled connection (autocommit) for one short call."""
        if self._pool is None:
            raise _closed()

        async def call(conn: Connection, run: Run) -> T:
            async with conn.cursor() as cursor:
                return await fn(cursor)

        with translate(what, self.settings.secrets):
            async with asyncio.timeout(self.config.op_timeout):
                return await self._pool.run(call, what)

    async def _short(self, what: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """One statement on a pooled connection."""

        async def one(cursor: Cursor) -> list[Any]:
            await cursor.execute(sql, params)
            return list(await cursor.fetchall())

        return await self._pooled(what, one)

    async def open(self, on_lost: LostCallback) -> None:
        if self._pool is not None:
            return
        self._on_lost = on_lost
        self._pool = ConnectionPool(
            lambda: connect(self.settings, self.config),
            self.settings.pool_size,
            self._is_closed,
            self.settings.secrets,
        )
        try:
            for ddl in (*holders_ddl(), _ROWS_DDL):
                await self._short("open", ddl, ())
        except BaseException:
            await self.aclose()
            raise
        self._heartbeat.start(self._interval)

    async def aclose(self) -> None:
        self._heartbeat.stop()
        holding = list(self._holding.values())
        self._holding.clear()
        for grant in holding:
            # (a ROLLBACK frees the row now; a closed socket only when the server notices)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.op_timeout):
                    await grant.data.conn.rollback()
            grant.data.conn.close()
        spare, self._spare = self._spare, []
        for conn in spare:
            conn.close()
        if holding and self._on_lost is not None:
            self._on_lost(holding, "the client was closed while the lock was held")
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    # -- holding ---------------------------------------------------------------------------------

    async def _lock_row(self, request: Request, deadline: float | None) -> Grant | None:
        ns, key = self.config.namespace, self._key(request.name)
        # (a plain read first: the upsert would queue behind the holder's row lock)
        if not await self._short("acquire", _ROW_EXISTS, (ns, key)):
            await self._short("acquire", _ENSURE_ROW, (ns, key))
        conn = await self._holder_connection()
        try:
            with translate("acquire", self.settings.secrets):
                async with conn.cursor() as cursor:
                    while True:
                        # (again after a wait that ended: a deadlock rolled it all back)
                        await conn.begin()
                        if await self._wait_for_row(cursor, (ns, key), deadline):
                            break
                        if deadline is not None:
                            conn.close()
                            return None
                    async with asyncio.timeout(self.config.op_timeout):
                        # (on another connection: committed now, even if this one dies)
                        token = await self._register(request, conn.thread_id())
        except BaseException:
            conn.close()
            raise
        grant = Grant(request.name, request.owner, token, None, _Holder(conn))
        self._holding[(request.name, request.owner)] = grant
        return grant

    async def _holder_connection(self) -> Connection:
        """A connection for one holder (or waiter): a spare one that still answers, or a new
        one (connecting costs several round trips: a hold's is kept for the next one)."""
        with translate("acquire", self.settings.secrets):
            while self._spare:
                conn = self._spare.pop()
                try:
                    async with asyncio.timeout(self.config.op_timeout):
                        await conn.ping(reconnect=False)
                except Exception:
                    conn.close()  # (gone while spare: a restart, an idle timeout)
                    continue
                except BaseException:
                    conn.close()
                    raise
                return conn
            async with asyncio.timeout(self.config.connect_timeout):
                return await connect(self.settings, self.config)

    async def _wait_for_row(
        self, cursor: Cursor, params: tuple[Any, ...], deadline: float | None
    ) -> bool:
        """Lock the row: True, or False when the server's wait ended first."""
        if deadline is None:
            sql, bound = f"{_LOCK_ROW} WAIT {_WAIT_CHUNK}", None
        else:
            left = deadline - monotonic()
            if left <= 0:
                sql, bound = f"{_LOCK_ROW} NOWAIT", self.config.op_timeout
            else:
                # (WAIT takes whole seconds: the client's deadline is the exact one)
                sql, bound = f"{_LOCK_ROW} WAIT {math.ceil(left):d}", left
        try:
            async with asyncio.timeout(bound):
                await cursor.execute(sql, params)
                await cursor.fetchall()
        except driver_errors() as exc:
            if is_retryable(exc):
                return False
            raise
        except BaseException:
            await self._kill_query(cursor.connection.thread_id())
            raise
        return True

    async def _kill_query(self, session: int) -> None:
        """Stop a wait that nobody will take the answer of (shielded, bounded, best effort)."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self._short("kill", "KILL QUERY %s", (session,)))

    async def _register(self, request: Request, session: int) -> int:
        ns, key = self.config.namespace, self._key(request.name)

        async def register(cursor: Cursor) -> int:
            token = await next_token(cursor, ns, key)
            await record_holder(cursor, ns, key, request.owner, token, session)
            return token

        return await self._pooled("acquire", register)

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        try:
            return await self._lock_row(request, deadline)
        except TimeoutError:
            if deadline is not None and monotonic() >= deadline:
                return None  # the client's deadline, finer than the server's whole seconds
            raise

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        grant = await self.acquire(request, monotonic())
        return Busy() if grant is None else grant

    async def _beat(self) -> float | None:
        """The keep-alive: every holding connection is asked; a dead one is a lost lock."""
        for grant in list(self._holding.values()):
            if not await self._alive(grant):
                self._lose(grant, "the connection holding the row lock was lost")
        return self._interval

    async def _alive(self, grant: Grant) -> bool:
        holder: _Holder = grant.data
        conn = holder.conn
        try:
            # (the gate: one query at a time on the connection)
            async with holder.gate, asyncio.timeout(self.config.op_timeout), conn.cursor() as c:
                await c.execute("SELECT 1")
                await c.fetchall()
        except Exception:
            return False
        return bool(conn.get_transaction_status())

    def _lose(self, grant: Grant, reason: str) -> None:
        if self._holding.get((grant.name, grant.owner)) is not grant:
            return
        del self._holding[(grant.name, grant.owner)]
        grant.data.conn.close()
        if self._on_lost is not None:
            self._on_lost([grant], reason)

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        started = monotonic()
        results: list[float | None] = []
        for grant in grants:
            mine = self._holding.get((grant.name, grant.owner)) is grant
            results.append(started + ttl if mine and await self._alive(grant) else None)
        return results

    async def release(self, grant: Grant) -> bool:
        if self._holding.pop((grant.name, grant.owner), None) is not grant:
            return False
        holder: _Holder = grant.data
        conn, clean = holder.conn, False
        try:
            async with holder.gate, asyncio.timeout(self.config.op_timeout):
                await conn.rollback()  # the row is free
            clean = True
            return True
        except Exception:
            return False  # the connection was gone: so was the lock, already
        finally:
            if clean and not self._is_closed(conn) and len(self._spare) < self.settings.pool_size:
                self._spare.append(conn)
            else:
                conn.close()

    async def abandon(self, request: Request) -> None:
        grant = self._holding.get((request.name, request.owner))
        if grant is not None:
            await self.release(grant)

    async def status(self, name: str) -> LockStatus | None:
        ns, key = self.config.namespace, self._key(name)
        rows = await self._short(
            "status", f"SELECT owner, token FROM {HOLDERS} WHERE {KEY}", (ns, key)
        )
        if not rows or not await self._row_locked(ns, key):
            return None
        owner, token = rows[0]
        return LockStatus(name, str(owner), int(token), None)

    async def _row_locked(self, ns: str, key: str) -> bool:
        async def locked(cursor: Cursor) -> bool:
            await cursor.connection.begin()
            try:
                await cursor.execute(f"{_LOCK_ROW} SKIP LOCKED", (ns, key))
                return not await cursor.fetchall()
            finally:
                await cursor.connection.rollback()

        return await self._pooled("status", locked)

    async def force_release(self, name: str) -> bool:
        ns, key = self.config.namespace, self._key(name)
        rows = await self._short(
            "force_release", f"SELECT session FROM {HOLDERS} WHERE {KEY}", (ns, key)
        )
        if not rows or not await self._row_locked(ns, key):
            return False
        session = int(rows[0][0])
        for grant in list(self._holding.values()):
            if grant.name == name and grant.data.conn.thread_id() == session:
                self._lose(grant, "force-released")
                return True
        with contextlib.suppress(Exception):  # (1094: that session has ended already)
            await self._short("force_release", "KILL CONNECTION %s", (session,))
        return True


def _closed() -> Exception:
    return BackendError("mysql: the client is not open (or was closed)")
