"""``mysql://user:pw@host:3306/db`` (alias ``mariadb://``): the lock table in MySQL/MariaDB.

``strategy="table"`` (the default): the lock table of :mod:`aiodlock.backends._sql` (one row
per name under the primary key, the owner, the expiry on the server's clock, the fencing
token as the row's own AUTO_INCREMENT id, a version for the optimistic take-over of an
expired row, and a line of waiters), on InnoDB through ``aiomysql``.  An uncontended cycle
is one INSERT and one DELETE (:mod:`.._sql_fast`).  The core's watchdog renews; a waiter
polls, and a release in this process wakes a local waiter at once.  The
other strategies are :mod:`.named` (GET_LOCK) and :mod:`.row` (SELECT ... FOR UPDATE);
:meth:`MySQLBackend.from_url` builds the one the URL asks for.  See
``docs/backends/mysql.md``.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Self, cast

from ..._deadlines import Bound, Deadlines
from ..._errors import BackendError, BackendTimeout
from ..._types import Capability, CommonConfig, LostCallback, Request
from ..._url import ParsedURL
from .._sql import Execute, Granted, LockTable, Script
from .._sql_backend import LockTableBackend, MakeScript
from .._sql_fast import FastPath
from ._dialect import MYSQL
from ._driver import Connection, Cursor, driver_errors, error_code, load
from ._pool import (
    DUPLICATE_KEY,
    ConnectionPool,
    is_lost,
    is_retryable,
    run_on,
    translate,
)
from ._settings import Settings, connect

__all__ = ["MySQLBackend"]


class MySQLBackend(LockTableBackend):
    """Locks as rows of a table in a MySQL or MariaDB database."""

    backend_name = "mysql"
    capabilities = (
        Capability.FENCING | Capability.CROSS_PROCESS | Capability.FAIR | Capability.URGENT
    )
    abandon_reads_first: ClassVar[bool] = False

    def __init__(self, config: CommonConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.poll_min, self.poll_max = settings.poll_min, settings.poll_max
        self.table = LockTable(MYSQL, config.namespace)
        self.fast_path: FastPath = FastPath(self.table)
        self._pool: ConnectionPool | None = None
        self._deadlines = Deadlines()

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        settings = Settings.from_url(url, options)
        load(settings.driver)  # (a clear error now if it is not installed)
        # (the scheme's one class builds the strategy's backend: the core only calls it)
        if settings.strategy == "named":
            from .named import NamedBackend

            return cast(Self, NamedBackend(config, settings))
        if settings.strategy == "row":
            from .row import RowBackend

            return cast(Self, RowBackend(config, settings))
        return cls(config, settings)

    def describe(self) -> str:
        return self.settings.describe()

    # -- connections -----------------------------------------------------------------------------

    async def _connect(self) -> Connection:
        return await connect(self.settings, self.config)

    async def _call(self, what: str, script: MakeScript, *, write: bool) -> Any:
        """Run one script on a pooled connection, bounded by ``op_timeout``."""
        pool = self._pool
        if pool is None:
            raise BackendError("mysql: the client is not open (or was closed)")
        with translate(what, self.settings.secrets):
            async with asyncio.timeout(self.config.op_timeout):
                return await pool.run(
                    lambda conn, run: run_on(conn, script(), write=write, run=run), what
                )

    # -- the fast path: one statement on an idle connection --------------------------------------
    #
    # Bounded by the backend's deadlines (closing the connection at the deadline ends the
    # statement: no ``asyncio.timeout``, no retry loop), and sent without the scripts'
    # machinery (the same statements as :class:`FastPath`'s scripts, which run instead when
    # no connection is idle, and after a deadlock or an idle connection found dead).

    async def _grab(self, name: str, owner: str, ttl: float) -> Granted | None:
        fast = self.fast_path
        again = lambda: fast.grab(name, owner, ttl)  # noqa: E731
        lent = self._lend()
        if lent is None:
            return cast("Granted | None", await self._call("acquire", again, write=False))
        pool, conn, cursor, bound = lent
        swept = False
        try:
            try:
                count = await cursor.execute(fast.grab_sql, fast.grab_params(name, owner, ttl))
            except driver_errors() as exc:
                if error_code(exc) != DUPLICATE_KEY:
                    raise
                count = 0  # (the name has a row: the table's scripts decide)
            token = cursor.lastrowid if count == 1 else None
            if token is not None and fast.sweep_due():
                swept = True  # (it commits as soon as it is sent)
                await cursor.execute(fast.sweep_sql)
        except BaseException as exc:
            failed = self._failed(pool, conn, exc, bound, "acquire", again, sent=swept)
            return cast("Granted | None", await failed)
        self._deadlines.end(bound)
        pool.give_back(conn, None, unsure=False)
        return None if token is None else Granted(int(token))

    async def _drop(self, name: str, owner: str, token: int) -> bool | None:
        fast = self.fast_path
        again = lambda: fast.drop(name, owner, token)  # noqa: E731
        lent = self._lend()
        if lent is None:
            return cast("bool | None", await self._call("release", again, write=False))
        pool, conn, cursor, bound = lent
        try:
            count = await cursor.execute(fast.drop_sql, fast.drop_params(name, owner, token))
        except BaseException as exc:
            failed = self._failed(pool, conn, exc, bound, "release", again, sent=True)
            return cast("bool | None", await failed)
        self._deadlines.end(bound)
        pool.give_back(conn, None, unsure=False)
        return True if count == 1 else None

    def _lend(self) -> tuple[ConnectionPool, Connection, Cursor, Bound] | None:
        """An idle connection and its cursor, lent with its statement's deadline started
        (None: none is idle, or the client is closed: the pool's way)."""
        pool = self._pool
        conn = None if pool is None else pool.lend_idle()
        if conn is None or pool is None:
            return None
        bound = self._deadlines.start(self.config.op_timeout, conn.close)
        return pool, conn, pool.cursor_of(conn), bound

    async def _failed(
        self,
        pool: ConnectionPool,
        conn: Connection,
        exc: BaseException,
        bound: Bound,
        what: str,
        again: MakeScript,
        *,
        sent: bool,
    ) -> Any:
        """A fast-path statement failed: the connection goes; after a deadlock, or when the
        idle connection was dead and nothing that commits was ``sent`` (an INSERT is safe to
        run again: it finds the owner's own row), the pool's way runs ``again`` (it retries);
        else the error, translated (a timeout: the deadline passed)."""
        self._deadlines.end(bound)
        pool.give_back(conn, exc, unsure=bound.expired)
        if bound.expired:
            raise BackendTimeout(f"mysql: {what} timed out") from exc
        if is_retryable(exc) or (is_lost(exc) and not sent):
            return await self._call(what, again, write=False)
        with translate(what, self.settings.secrets):
            raise exc

    async def _run(self, what: str, read: MakeScript | None, write: MakeScript | None) -> Any:
        answer = None
        if read is not None:
            answer = await self._call(what, read, write=False)
        if write is not None and answer is None:
            answer = await self._call(what, write, write=True)
        return answer

    async def abandon(self, request: Request) -> None:
        # A cancelled acquire's batch may still be on its way to the server: seal its fate
        # first (see ConnectionPool.settle), then delete what it may have left.
        pool = self._pool
        if pool is not None:
            with translate("abandon", self.settings.secrets):
                async with asyncio.timeout(self.config.op_timeout):
                    await pool.settle(within=self.config.op_timeout)
        await super().abandon(request)

    def _schema(self) -> Script[None]:
        for statement in self.table.schema():
            yield Execute(statement, ())

    async def open(self, on_lost: LostCallback) -> None:
        if self._pool is not None:
            return
        driver = load(self.settings.driver)
        self._pool = ConnectionPool(
            self._connect,
            self.settings.pool_size,
            driver.is_closed,
            self.settings.secrets,
            cursor=driver.cursor,
        )
        try:
            await self._call("open", self._schema, write=False)
        except BaseException:
            await self.aclose()
            raise
        s = self.settings
        self._join_board(("mysql", s.host, s.port, s.database))

    async def aclose(self) -> None:
        self._leave_board()
        self._deadlines.cancel()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()
