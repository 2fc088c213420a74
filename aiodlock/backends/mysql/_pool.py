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
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from ..._errors import BackendError, translating
from ..._retry import InDoubt, retrying
from ..._slots import Slots
from .._sql import Script, run_script_async
from ._driver import Connection, Cursor, driver_errors, error_code

__all__ = [
    "DUPLICATE_KEY",
    "ConnectionPool",
    "Run",
    "is_lost",
    "is_retryable",
    "run_on",
    "translate",
]

T = TypeVar("T")

#: Client error codes of a connection that is gone (or never came): can't connect (2002,
#: 2003), server gone away (2006), lost during a query (2013), out of sync (2014, 2055).
_LOST = frozenset({2002, 2003, 2006, 2013, 2014, 2055})
#: A lock wait timeout (1205; MySQL 8's NOWAIT: 3572) or a deadlock (1213): the transaction
#: (or its statement) was rolled back, and running it again is safe.
_RETRYABLE = frozenset({1205, 1213, 3572})
DUPLICATE_KEY = 1062
_UNKNOWN_THREAD = 1094


def is_lost(exc: BaseException) -> bool:
    """The connection is gone (a restart, a network failure, an idle timeout)."""
    return error_code(exc) in _LOST or isinstance(exc, ConnectionError)


def is_retryable(exc: BaseException) -> bool:
    """A lock wait timeout or a deadlock: nothing was written, try again."""
    return error_code(exc) in _RETRYABLE


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
    errors = driver_errors()
    with translating("mysql", errors, what=what, secrets=secrets):
        try:
            yield
        except errors as exc:
            code = error_code(exc)
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


async def run_on(conn: Connection, script: Script[T], *, write: bool, run: Run) -> T:
    """Run ``script`` on ``conn``: a write one in one transaction (committed even when it
    reports busy: a waiter's place in line must stay), a read one in autocommit (a write in
    it commits on its own: the fast path's; only its INSERT is safe to run again)."""

    async def execute(sql: str, params: tuple[Any, ...]) -> tuple[int, list[Any]]:
        if not write and not sql.startswith("SELECT"):
            run.committing = True  # (it may commit as soon as it is sent)
        async with conn.cursor() as cursor:
            count = await cursor.execute(sql, params)
            return int(count), list(await cursor.fetchall())

    async def insert(sql: str, params: tuple[Any, ...]) -> int | None:
        # (an INSERT run twice finds the owner's own row, which the table refreshes)
        async with conn.cursor() as cursor:
            try:
                count = await cursor.execute(sql, params)
            except driver_errors() as exc:
                if error_code(exc) == DUPLICATE_KEY:  # the name has a row
                    return None
                raise
            return int(cursor.lastrowid) if count == 1 else None

    if write:
        await conn.begin()
    result = await run_script_async(execute, script, insert)
    if write:
        run.committing = True
        await conn.commit()
    return result


class ConnectionPool:
    """At most ``size`` connections; an idle one is lent again, a failed one is closed."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        size: int,
        is_closed: Callable[[Connection], bool],
        secrets: tuple[str, ...] = (),
        *,
        cursor: Callable[[Connection], Awaitable[Cursor]] | None = None,
    ) -> None:
        self._connect = connect
        self._secrets = secrets
        self._is_closed = is_closed
        self._cursor = cursor
        self._idle: list[Connection] = []
        #: id(connection) -> its cursor (:meth:`cursor_of`), made with it, while it is open
        self._cursors: dict[int, Cursor] = {}
        self._slots = Slots(size)
        #: The server sessions of connections closed as their call was cancelled (see
        #: :meth:`settle`).
        self._orphans: InDoubt[int] = InDoubt()
        self.closed = False

    def _give_back(
        self, conn: Connection, failure: BaseException | None, *, unsure: bool = False
    ) -> None:
        """Take back a lent connection: idle again, or closed after a failure (its state is
        unknown: the server rolls back what it had open) or once closed.  ``unsure``: what it
        sent may still run (as after a cancellation)."""
        if failure is not None:
            if unsure or isinstance(failure, asyncio.CancelledError):
                self._orphans.note(conn.thread_id())
            self._close(conn)
        elif self.closed or self._is_closed(conn):
            self._close(conn)
        else:
            self._idle.append(conn)

    def _close(self, conn: Connection) -> None:
        self._cursors.pop(id(conn), None)
        conn.close()

    def cursor_of(self, conn: Connection) -> Cursor:
        """The cursor of ``conn``, a lent connection of a pool made with a cursor factory (one
        per connection, made with it, as a loop of statements on one connection keeps one)."""
        return self._cursors[id(conn)]

    async def _new(self) -> Connection:
        """A new connection, with its cursor when the pool keeps them."""
        conn = await self._connect()
        if self._cursor is not None:
            try:
                self._cursors[id(conn)] = await self._cursor(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    def lend_idle(self) -> Connection | None:
        """An idle connection if one is idle and a slot is free (no wait, no connect), else
        None; it comes back through :meth:`give_back`."""
        if self.closed or not self._idle or not self._slots.take_now():
            return None
        return self._idle.pop()

    def give_back(self, conn: Connection, failure: BaseException | None, *, unsure: bool) -> None:
        """Take back a connection of :meth:`lend_idle` (see :meth:`_give_back`)."""
        self._give_back(conn, failure, unsure=unsure)
        self._slots.give()

    async def run(self, fn: Callable[[Connection, Run], Awaitable[T]], what: str = "call") -> T:
        """``fn(connection, run)`` on a lent connection, its errors translated; again (the
        core's :func:`~aiodlock._retry.retrying`) on another one when an idle connection
        turned out dead before anything was committed (the server restarted, or closed it:
        once), and after a deadlock or a lock wait timeout (rolled back by the server: until
        the caller's time is up).  The caller bounds the time."""
        stale = stale_used = False

        async def attempt() -> T:
            nonlocal stale
            run, reused = Run(), False
            try:
                with translate(what, self._secrets):
                    async with self._slots:
                        if self.closed:
                            raise BackendError("mysql: the client is closed")
                        reused = bool(self._idle)
                        conn = self._idle.pop() if reused else await self._new()
                        try:
                            result = await fn(conn, run)
                        except BaseException as exc:
                            self._give_back(conn, exc)
                            raise
                        self._give_back(conn, None)
                        return result
            except BackendError as error:
                cause = error.__cause__
                stale = reused and cause is not None and is_lost(cause) and not run.committing
                raise

        def again(error: BackendError) -> bool:
            nonlocal stale_used
            if stale and not stale_used:
                stale_used = True  # (once: a second dead one means the server is down)
                return True
            return error.__cause__ is not None and is_retryable(error.__cause__)

        try:
            return await attempt()  # (the common case, without the retry loop's frame)
        except BackendError as error:
            if not again(error):
                raise
        return await retrying(attempt, retry_if=again, what=f"mysql {what}", first=0.001, cap=0.05)

    async def settle(self, within: float) -> None:
        """End the server sessions of the connections closed as their call was cancelled in
        the last ``within`` seconds, and wait until the server has: a batch sent just before
        its caller was cancelled may not have begun yet, and would then run (and commit)
        after whatever comes next.  KILL ends a session that waits for its query or runs it
        (rolling back what it had not committed); once the server lists none of them, each
        one's fate is sealed.  (Older ones are forgotten: a session number is reused after a
        restart of the server, and must never end a session of somebody else.)"""
        sessions = self._orphans.take(within)
        if not sessions:
            return
        listed = ", ".join(["%s"] * len(sessions))
        alive = f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({listed})"

        async def kill(conn: Connection, run: Run) -> None:
            async with conn.cursor() as cursor:
                for session in sessions:
                    try:
                        await cursor.execute("KILL CONNECTION %s", (session,))
                    except driver_errors() as exc:
                        if error_code(exc) != _UNKNOWN_THREAD:  # (it has ended already)
                            raise
                while True:
                    await cursor.execute(alive, tuple(sessions))
                    if not (await cursor.fetchone())[0]:
                        return
                    await asyncio.sleep(0.001)

        await self.run(kill, "abandon")

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)
