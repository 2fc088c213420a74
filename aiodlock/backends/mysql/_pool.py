"""Connections to MySQL / MariaDB: a small pool, the script runner, the error translation.

A connection is lent for ONE script (a few statements) and comes back at once, so a waiter
that sleeps between attempts holds none.  A connection whose call failed or was cancelled
is closed, never lent again: a cancelled query leaves it in an unknown state (the server
may still be running it, or be waiting on a row lock), and closing it makes the server roll
back whatever transaction it had open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiomysql
import pymysql

from ..._errors import BackendError, translating
from .._sql import Script, run_script_async

__all__ = ["ConnectionPool", "Run", "is_lost", "is_retryable", "run_on", "translate"]

T = TypeVar("T")

#: Client error codes of a connection that is gone (or never came): can't connect (2002,
#: 2003), server gone away (2006), lost during a query (2013), out of sync (2014, 2055).
_LOST = frozenset({2002, 2003, 2006, 2013, 2014, 2055})
#: A lock wait timeout (1205; MySQL 8's NOWAIT: 3572) or a deadlock (1213): the transaction
#: (or its statement) was rolled back, and running it again is safe.
_RETRYABLE = frozenset({1205, 1213, 3572})
_DUPLICATE_KEY = 1062


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_lost(exc: BaseException) -> bool:
    """The connection is gone (a restart, a network failure, an idle timeout)."""
    return _code(exc) in _LOST or isinstance(exc, ConnectionError)


def is_retryable(exc: BaseException) -> bool:
    """A lock wait timeout or a deadlock: nothing was written, try again."""
    return _code(exc) in _RETRYABLE


_HINTS = {
    1044: "the user may not use this database",
    1045: "wrong user name or password",
    1049: "the database does not exist: create it first (CREATE DATABASE ...)",
    1142: "the user lacks a privilege on the lock tables (needs SELECT, INSERT, UPDATE, "
    "DELETE and, for the first use, CREATE)",
}


@contextlib.contextmanager
def translate(what: str, secrets: tuple[str, ...]) -> Iterator[None]:
    """The one place the driver's exceptions become BackendError / BackendTimeout."""
    with translating("mysql", (pymysql.err.MySQLError,), what=what, secrets=secrets):
        try:
            yield
        except pymysql.err.MySQLError as exc:
            code = _code(exc)
            if code in _LOST:
                error = BackendError(f"mysql: {what} failed: the server could not be reached")
                error.transient = True
                raise error from exc
            if code in _HINTS:
                raise BackendError(f"mysql: {what} failed: {_HINTS[code]} ({exc.args[1]})") from exc
            raise


@dataclasses.dataclass(slots=True)
class Run:
    """What one run of a script has done (to tell whether running it again is safe)."""

    #: COMMIT was sent: if its answer is lost, the transaction may have committed.
    committing: bool = False


async def run_on(conn: aiomysql.Connection, script: Script[T], *, write: bool, run: Run) -> T:
    """Run ``script`` on ``conn`` (autocommit; a write one in one transaction, committed
    even when it reports busy: a waiter's place in line must stay)."""

    async def execute(sql: str, params: tuple[Any, ...]) -> tuple[int, list[Any]]:
        async with conn.cursor() as cursor:
            try:
                count = await cursor.execute(sql, params)
            except pymysql.err.IntegrityError as exc:
                if _code(exc) == _DUPLICATE_KEY:  # the INSERT of a name just taken
                    return 0, []
                raise
            return int(count), list(await cursor.fetchall())

    if write:
        await conn.begin()
    result = await run_script_async(execute, script)
    if write:
        run.committing = True
        await conn.commit()
    return result


class ConnectionPool:
    """At most ``size`` connections; an idle one is lent again, a failed one is closed."""

    def __init__(self, connect: Callable[[], Awaitable[aiomysql.Connection]], size: int) -> None:
        self._connect = connect
        self._idle: list[aiomysql.Connection] = []
        self._slots = asyncio.Semaphore(size)
        self.closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[tuple[aiomysql.Connection, bool]]:
        """``(connection, reused)``: reused is True for one that sat idle (it may be dead)."""
        async with self._slots:
            if self.closed:
                raise BackendError("mysql: the client is closed")
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                yield conn, reused
            except BaseException:
                conn.close()  # its state is unknown: the server rolls back what it had open
                raise
            if self.closed or conn.closed:
                conn.close()
            else:
                self._idle.append(conn)

    async def run(self, fn: Callable[[aiomysql.Connection, Run], Awaitable[T]]) -> T:
        """``fn(connection, run)`` on a lent connection; again on another one when an idle
        connection turned out dead before anything was committed (the server restarted, or
        closed it), and after a deadlock or a lock wait timeout (rolled back by the server).
        The caller bounds the time."""
        stale_ok = True
        while True:
            run, reused = Run(), False
            try:
                async with self.connection() as (conn, reused):
                    return await fn(conn, run)
            except Exception as exc:
                if reused and stale_ok and is_lost(exc) and not run.committing:
                    stale_ok = False
                    continue
                if is_retryable(exc):
                    await asyncio.sleep(0.001)
                    continue
                raise

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
