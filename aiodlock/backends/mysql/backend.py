"""``mysql://user:pw@host:3306/db`` (alias ``mariadb://``): the lock table in MySQL/MariaDB.

``strategy="table"`` (the default and, for now, the only one): the lock table of
:mod:`aiodlock.backends._sql` (one row per held name under the primary key, the owner, the
expiry on the server's clock, a version for the optimistic take-over of an expired row, and
a counter table for fencing tokens that is never reset), on InnoDB through ``aiomysql``.
The core's watchdog renews; a waiter polls, and a release in this process wakes a local
waiter at once.  See ``docs/backends/mysql.md``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, ClassVar, Self, TypeVar

import aiomysql

from ..._errors import ConfigurationError
from ..._types import Capability, CommonConfig, LostCallback
from ..._url import ParsedURL, format_host, take_float, take_int, take_str
from .._sql import Execute, LockTable, Script
from .._sql_backend import LockTableBackend, MakeScript
from ._dialect import MYSQL
from ._pool import ConnectionPool, Run, is_lost, is_retryable, run_on, translate

__all__ = ["MySQLBackend"]

T = TypeVar("T")

DEFAULT_PORT = 3306
STRATEGIES = ("table",)


class MySQLBackend(LockTableBackend):
    """Locks as rows of a table in a MySQL or MariaDB database."""

    backend_name = "mysql"
    capabilities = Capability.FENCING | Capability.CROSS_PROCESS
    abandon_reads_first: ClassVar[bool] = False

    def __init__(
        self,
        config: CommonConfig,
        *,
        host: str,
        port: int = DEFAULT_PORT,
        user: str | None = None,
        password: str | None = None,
        database: str,
        scheme: str = "mysql",
        strategy: str = "table",
        pool_size: int = 10,
        poll_min: float = 0.005,
        poll_max: float = 0.1,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConfigurationError(
                f"option 'strategy' must be one of {', '.join(map(repr, STRATEGIES))}, "
                f"got {strategy!r}"
            )
        if not 0 < poll_min <= poll_max:
            raise ConfigurationError(
                f"options 'poll_min' and 'poll_max' need 0 < poll_min <= poll_max, "
                f"got {poll_min} and {poll_max}"
            )
        self.config = config
        self.host, self.port, self.user, self.database = host, port, user, database
        self._password = password or ""
        self._secrets = (self._password,) if self._password else ()
        self._scheme = scheme
        self.strategy = strategy
        self.pool_size = pool_size
        self.poll_min, self.poll_max = poll_min, poll_max
        self.table = LockTable(MYSQL, config.namespace)
        self._pool: ConnectionPool | None = None

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        if len(url.hosts) != 1:
            raise ConfigurationError(
                "a mysql URL names one server: 'mysql://user:password@host:3306/database'"
            )
        database = url.path[1:] if url.path.startswith("/") else url.path
        if not database or "/" in database:
            raise ConfigurationError(
                "a mysql URL needs a database name as its path: "
                "'mysql://user:password@host:3306/database'"
            )
        ((host, port),) = url.host_list(DEFAULT_PORT)
        return cls(
            config,
            host=host,
            port=port,
            user=url.username,
            password=url.password,
            database=database,
            scheme=url.scheme.lower(),
            strategy=take_str(options, "strategy", "table") or "table",
            pool_size=take_int(options, "pool_size", 10, minimum=1, maximum=1000),
            poll_min=take_float(options, "poll_min", 0.005, allow_zero=False),
            poll_max=take_float(options, "poll_max", 0.1, allow_zero=False),
        )

    def describe(self) -> str:
        auth = ""
        if self.user is not None:
            auth = self.user + (":***" if self._password else "") + "@"
        return f"{self._scheme}://{auth}{format_host(self.host, self.port)}/{self.database}"

    # -- connections -----------------------------------------------------------------------------

    async def _connect(self) -> aiomysql.Connection:
        conn = await aiomysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self._password,
            db=self.database,
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=self.config.connect_timeout,
        )
        try:
            async with conn.cursor() as cursor:
                # UTC: UNIX_TIMESTAMP(NOW(6)) is exact; READ COMMITTED: a missing row takes
                # no gap lock, and every read sees the last commit; no notes (CREATE TABLE
                # IF NOT EXISTS of an existing table would cost a SHOW WARNINGS and a
                # Python warning).
                wait = max(1, math.ceil(self.config.op_timeout))
                await cursor.execute(
                    f"SET time_zone = '+00:00', sql_notes = 0, innodb_lock_wait_timeout = {wait:d}"
                )
                await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _call(self, what: str, script: MakeScript, *, write: bool) -> Any:
        """Run one script on a pooled connection, bounded by ``op_timeout``.

        Run again on another connection when an idle one turned out dead before anything
        was committed (the server restarted), and after a deadlock or a lock wait timeout
        (rolled back by the server).
        """
        pool = self._pool
        if pool is None:
            raise ConfigurationError("mysql: the backend is not open")
        with translate(what, self._secrets):
            async with asyncio.timeout(self.config.op_timeout):
                stale_ok = True
                while True:
                    run, reused = Run(), False
                    try:
                        async with pool.connection() as (conn, reused):
                            return await run_on(conn, script(), write=write, run=run)
                    except Exception as exc:
                        if reused and stale_ok and is_lost(exc) and not run.committing:
                            stale_ok = False
                            continue
                        if is_retryable(exc):
                            await asyncio.sleep(0.001)
                            continue
                        raise

    async def _run(self, what: str, read: MakeScript | None, write: MakeScript | None) -> Any:
        answer = None
        if read is not None:
            answer = await self._call(what, read, write=False)
        if write is not None and answer is None:
            answer = await self._call(what, write, write=True)
        return answer

    def _schema(self) -> Script[None]:
        for statement in self.table.schema():
            yield Execute(statement, ())

    async def open(self, on_lost: LostCallback) -> None:
        if self._pool is not None:
            return
        self._pool = ConnectionPool(self._connect, self.pool_size)
        try:
            await self._call("open", self._schema, write=False)
        except BaseException:
            await self.aclose()
            raise
        self._join_board(("mysql", self.host, self.port, self.database))

    async def aclose(self) -> None:
        self._leave_board()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()
