"""``postgresql://...?strategy=table``: the lock table, woken by LISTEN/NOTIFY.

The shared lock-table logic of :mod:`aiodlock.backends._sql` (one row per name under the
primary key, the owner, the expiry on the server's clock, the fencing token as the row's
own identity id, a version for the optimistic take-over of an expired row, and a line of
waiters for ``fair=True`` and the core's urgent waiters) in the PostgreSQL dialect, on a
small pool of asyncpg sessions (:mod:`._pool`); write scripts run in one transaction.  An
uncontended cycle is one INSERT and one DELETE (the shared fast path).  The core's watchdog
renews the rows.

A release (and an abandon or a break that freed something) NOTIFYs, in its transaction, the
client whose waiter may take the name now (:func:`._table_sql.call_next`: the one where the
first in line waits, else the one that has waited longest); each client LISTENs on one
connection (:class:`._connection.Listener`, shared with the advisory strategy) and wakes
only that local waiter.  A waiter still asks again within ``poll_interval`` when no NOTIFY
comes (a holder that died: its row expires).  See docs/backends/postgres.md.
"""

from __future__ import annotations

import asyncio
import random
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Self

from ..._errors import BackendError, ConfigurationError
from ..._retry import retrying
from ..._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LostCallback,
    Request,
    Waiter,
    client_of,
)
from ..._url import ParsedURL, take_int
from ..._wakeup import Backoff, WakeupBoard
from .._sql import Execute, Fetch, Script
from .._sql_backend import LockTableBackend, MakeScript
from . import _statements as sql
from ._connection import CLOSED
from ._listener import Listener
from ._pool import Pool, server_timeouts
from ._settings import CREATE_RACE, Settings
from ._table_sql import AnnouncingFastPath, AnnouncingTable

__all__ = ["PostgresTableBackend"]

#: $1 relation names -> how many of them do not exist.
_MISSING = "SELECT count(*) FROM unnest($1::text[]) r WHERE to_regclass(r) IS NULL"
#: The LISTEN sessions waiting for a name (key: the name's 64-bit hash), oldest first.
LISTENERS = "aiodlock_listeners"


def _storable(owner: str) -> bool:
    """Can ``owner`` be stored as text (no NUL, no lone surrogate)?"""
    if "\0" in owner:
        return False
    if owner.isascii():
        return True
    try:
        owner.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
        self.table: AnnouncingTable = AnnouncingTable(
            config.namespace, self._listeners, self.channel
        )
        self.fast_path = AnnouncingFastPath(self.table, self._listeners)
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
            raise BackendError(CLOSED)
        return self._listener

    # -- connections -----------------------------------------------------------------------------

    async def _call(self, what: str, script: MakeScript, *, write: bool) -> Any:
        """Run one script on a pooled session, bounded by ``op_timeout``."""
        pool = self._pool
        if pool is None:
            raise BackendError(CLOSED)
        with self.settings.translate(what):  # (the pool translates the rest; this: the timeout)
            async with asyncio.timeout(self.config.op_timeout):
                return await pool.run(script, write=write, what=what)

    async def _run(self, what: str, read: MakeScript | None, write: MakeScript | None) -> Any:
        answer = await self._call(what, read, write=False) if read is not None else None
        if write is not None and answer is None:
            answer = await self._call(what, write, write=True)
        return answer

    def _schema(self) -> Script[None]:
        """Create what is missing (a plain read first: CREATE INDEX takes a table lock even
        when the index exists, which would queue behind every write under way)."""
        t = self.table
        relations = [t.locks, f"{t.locks}_expiry", t.line, f"{t.line}_order"]
        relations += [f"{t.line}_expiry", self._listeners]
        rows = yield Fetch(_MISSING, (relations,))
        if rows[0][0]:
            for statement in [*t.schema(), sql.create_waiters(self._listeners, clients=True)]:
                yield Execute(statement, ())
        rows = yield Fetch(sql.HAS_CLIENT, (self._listeners,))
        if not rows[0][0]:  # (a table made before the column: once)
            yield Execute(sql.add_client(self._listeners), ())

    async def open(self, on_lost: LostCallback) -> None:
        if self._pool is not None:
            return
        timeouts = server_timeouts(self.config.op_timeout)
        self._pool = Pool(
            lambda: self.settings.connect(**timeouts), self.pool_size, self.settings.translate
        )
        self._listener = Listener(self.settings, self.channel, self._listeners, clients=True)
        try:
            # (CREATE ... IF NOT EXISTS by two sessions at once: one of them may fail)
            await retrying(
                lambda: self._call("create the lock tables", self._schema, write=False),
                tries=3,
                retry_if=lambda exc: isinstance(exc.__cause__, CREATE_RACE),
                what="postgres: create the lock tables",
            )
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
        key, owner = self.key(request.name), request.owner
        return self.listener.waiter(key, backoff, owner, client_of(owner))

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        if not _storable(request.owner):
            raise ConfigurationError(
                "postgres (strategy=table): an owner is stored as text: it cannot hold a NUL "
                f"or a lone surrogate, got {request.owner!r:.80}"
            )
        outcome = await super().try_acquire(request, will_wait=will_wait)
        if isinstance(outcome, Busy):
            # Ask again within about poll_interval even if no NOTIFY comes (a holder that
            # died: its row expires; the first in line elsewhere, not called): the fallback.
            poll = random.uniform(self.poll_max / 2, self.poll_max)
            if outcome.retry_after is None or outcome.retry_after > poll:
                return Busy(poll)
        return outcome

    async def _pass_on(self, name: str, head: str) -> bool:
        if await super()._pass_on(name, head):
            return True
        # The call went to this client, not to the head's: a row of the line committed after
        # the release read it (ids are handed out in one order, rows committed in another).
        # Call the head now, or it would wait for its poll.
        table = self.table
        await self._call("call the first in line", lambda: table.announce(name), write=False)
        return True

    async def abandon(self, request: Request) -> None:
        if not _storable(request.owner):
            return  # (nothing of it was ever stored)
        pool = self._pool
        if pool is not None and pool.doubtful:
            # An attempt cut short may still be committing on its (discarded) session:
            # end it first, or the clean-up could miss the row it is about to commit.
            await self._call("abandon", pool.settle, write=False)
        await super().abandon(request)
