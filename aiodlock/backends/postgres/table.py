"""``postgresql://...?strategy=table``: the lock table, woken by LISTEN/NOTIFY.

The shared lock-table logic of :mod:`aiodlock.backends._sql` (one row per held name under
the primary key, the owner, the expiry on the server's clock, a version for the optimistic
take-over of an expired row, a counter table for fencing tokens that is never reset, and a
line of waiters for ``fair=True`` and the core's urgent waiters) in the PostgreSQL dialect,
on a small pool of asyncpg sessions (:mod:`._pool`); write scripts run in one transaction.
The core's watchdog renews the rows.

A release (and an abandon or a break that freed something) NOTIFYs, in its transaction, the
client that has waited longest for the name (:func:`._statements.call_next`); each client
LISTENs on one connection (:class:`._connection.Listener`, shared with the advisory
strategy) and wakes only its local waiter of that name.  A waiter still asks again within
``poll_interval`` when no NOTIFY comes (a holder that died: its row expires).  See
docs/backends/postgres.md.
"""

from __future__ import annotations

import asyncio
import random
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Self

import asyncpg

from ..._errors import BackendError
from ..._types import Busy, Capability, CommonConfig, Grant, LostCallback, Request, Waiter
from ..._url import ParsedURL, take_int
from ..._wakeup import Backoff, WakeupBoard
from .._sql import Execute, Fetch, LockTable, Script
from .._sql_backend import LockTableBackend, MakeScript
from . import _statements as sql
from ._connection import Listener
from ._dialect import POSTGRES
from ._pool import Pool, server_timeouts
from ._settings import Settings

__all__ = ["PostgresTableBackend"]

#: The LISTEN sessions waiting for a name (key: the name's 64-bit hash), oldest first.
LISTENERS = "aiodlock_listeners"


def call_next(listeners: str, line: str) -> str:
    """$1 key, $2 channel, $3 namespace, $4 name: NOTIFY (at commit) the client whose waiter
    may take the name now.  With a line of waiters (fair or urgent ones), every client
    listening for the name is told the owner first in line (``"key owner"``) and only the
    one where that owner waits wakes it; without one, the client that has waited longest
    alone is told the key (:func:`._statements.call_next`), and wakes one of its waiters."""
    now = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    return (
        f"WITH head AS (SELECT owner FROM {line} WHERE namespace = $3 AND name = $4"
        f" AND expires_at > {now} ORDER BY id LIMIT 1) "
        "SELECT pg_notify($2::text || '_' || w.pid::text,"
        " $1::bigint::text || coalesce(' ' || (SELECT owner FROM head), '')) FROM"
        f" (SELECT pid FROM {listeners} WHERE key = $1::bigint AND NOT {sql.DEAD_PID}"
        " ORDER BY since LIMIT CASE WHEN EXISTS (SELECT 1 FROM head) THEN NULL ELSE 1 END) w"
    )


class AnnouncingTable(LockTable):
    """The lock table whose releases call the client whose waiter may take the name now (a
    NOTIFY in the same transaction: sent when, and only if, it commits)."""

    def __init__(self, namespace: str, listeners: str, channel: str) -> None:
        super().__init__(POSTGRES, namespace)
        self._call_next = call_next(listeners, self.line)
        self._channel = channel

    def _announce(self, name: str) -> Script[None]:
        key = sql.lock_key(self.namespace, name)
        params = (key, self._channel, self.namespace, self._key(name))
        yield Fetch(self._call_next, params)

    def release(self, name: str, owner: str, token: int) -> Script[bool]:
        released = yield from super().release(name, owner, token)
        yield from self._announce(name)  # (even if the row had expired: the name is free)
        return released

    def abandon(self, name: str, owner: str) -> Script[bool]:
        freed = yield from super().abandon(name, owner)
        if freed:  # (a row, or a place in line that may have kept the next one waiting)
            yield from self._announce(name)
        return freed

    def force_release(self, name: str) -> Script[bool]:
        released = yield from super().force_release(name)
        yield from self._announce(name)
        return released


class PostgresTableBackend(LockTableBackend):
    """Locks as rows of a table in a PostgreSQL database, woken by LISTEN/NOTIFY."""

    backend_name = "postgres"
    capabilities = (
        Capability.FENCING | Capability.CROSS_PROCESS | Capability.FAIR | Capability.URGENT
    )
    #: (a read on a pooled session does not wait for a transaction still committing on a
    #: discarded one: delete at once, as MySQL does)
    abandon_reads_first: ClassVar[bool] = False

    def __init__(self, config: CommonConfig, settings: Settings, options: dict[str, Any]) -> None:
        self.config = config
        self.settings = settings
        self.strategy, self.host, self.port = settings.strategy, settings.host, settings.port
        self.database, self.user, self.sslmode = settings.database, settings.user, settings.sslmode
        self.pool_size = take_int(options, "pool_size", 10, minimum=1, maximum=1000)
        self.poll_min, self.poll_max = min(0.01, settings.poll_interval), settings.poll_interval
        self.channel = sql.channel_of(config.namespace)
        self._listeners = sql.quote_ident(LISTENERS)
        self.table = AnnouncingTable(config.namespace, self._listeners, self.channel)
        self._pool: Pool | None = None
        self._listener: Listener | None = None

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(config, Settings(config, url, options), options)

    def describe(self) -> str:
        return self.settings.describe("strategy=table")

    def key(self, name: str) -> int:
        """The 64-bit key a NOTIFY names ``name`` by (a hash: two names may share one, which
        costs a needless wake-up, never a wrong grant)."""
        return sql.lock_key(self.config.namespace, name)

    @property
    def listener(self) -> Listener:
        if self._listener is None:
            raise BackendError("postgres: the client is not open (or was closed)")
        return self._listener

    # -- connections -----------------------------------------------------------------------------

    async def _call(self, what: str, script: MakeScript, *, write: bool) -> Any:
        """Run one script on a pooled session, bounded by ``op_timeout``."""
        pool = self._pool
        if pool is None:
            raise BackendError("postgres: the client is not open (or was closed)")
        with self.settings.translate(what):
            async with asyncio.timeout(self.config.op_timeout):
                return await pool.run(script, write=write)

    async def _run(self, what: str, read: MakeScript | None, write: MakeScript | None) -> Any:
        answer = await self._call(what, read, write=False) if read is not None else None
        if write is not None and answer is None:
            answer = await self._call(what, write, write=True)
        return answer

    def _schema(self) -> Script[None]:
        for statement in [*self.table.schema(), sql.create_waiters(self._listeners)]:
            yield Execute(statement, ())

    async def open(self, on_lost: LostCallback) -> None:
        if self._pool is not None:
            return
        timeouts = server_timeouts(self.config.op_timeout)
        self._pool = Pool(lambda: self.settings.connect(**timeouts), self.pool_size)
        self._listener = Listener(self.settings, self.channel, self._listeners)
        try:
            for _ in range(3):
                try:
                    await self._call("create the lock tables", self._schema, write=False)
                    break
                except BackendError as exc:
                    # (CREATE ... IF NOT EXISTS by two sessions at once: one of them fails)
                    if not isinstance(exc.__cause__, asyncpg.UniqueViolationError):
                        raise
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        pool, listener = self._pool, self._listener
        self._pool = self._listener = None
        if listener is not None:
            await listener.close()
        if pool is not None:
            await pool.aclose()

    # -- waiting: the NOTIFY of a release, the poll as the fallback -------------------------------

    @property
    def board(self) -> WakeupBoard | None:
        return self._listener.board if self._listener is not None else None

    def board_key(self, name: str) -> str:
        return str(self.key(name))

    def _wake_one(self, name: str) -> None:
        # (the NOTIFY wakes the next waiter, here or elsewhere; a local waiter that no NOTIFY
        # reaches, the LISTEN session being gone, is woken here)
        listener, key = self._listener, self.key(name)
        if listener is not None and not listener.listening_for(key):
            listener.board.wake_one(str(key))

    def waiter(self, request: Request) -> AbstractAsyncContextManager[Waiter]:
        backoff = Backoff(self.poll_min, self.poll_max)
        return self.listener.waiter(self.key(request.name), backoff, request.owner)

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        outcome = await super().try_acquire(request, will_wait=will_wait)
        if isinstance(outcome, Busy):
            # Ask again within about poll_interval even if no NOTIFY comes (a holder that
            # died: its row expires; the first in line elsewhere, not called): the fallback.
            poll = random.uniform(self.poll_max / 2, self.poll_max)
            if outcome.retry_after is None or outcome.retry_after > poll:
                return Busy(poll)
        return outcome
