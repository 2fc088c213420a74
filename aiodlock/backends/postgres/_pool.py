"""The connections of ``strategy="table"``: a small pool of asyncpg sessions, each lent for
ONE script (a few statements, a write one in one transaction) and back at once, so a waiter
that sleeps between attempts holds none.

A session whose call failed or was cancelled is terminated, never lent again: its state is
unknown (the server may still run the statement, or wait on a row lock), and the server
rolls back what it had open.  Each session carries ``statement_timeout`` and
``idle_in_transaction_session_timeout``: a statement or a transaction of a client that went
away (or stopped) ends on the server within ``op_timeout`` or two.
"""

from __future__ import annotations

import asyncio
import datetime
import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import asyncpg

from ..._errors import BackendError
from ..._retry import InDoubt, retrying
from .._sql import Fetch, Script, run_script_async
from ._connection import CLOSED

__all__ = ["Pool", "Session", "server_timeouts"]

T = TypeVar("T")

#: The session went away (a restart, a terminated backend, a network failure); an idle
#: session the server ended may not know it yet, and refuse a statement as "another
#: operation is in progress" (InternalClientError).
_LOST = (
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    ConnectionError,
)
#: Rolled back by the server, nothing written: running the script again is safe.
_AGAIN = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
_STARTED = "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
#: $1 pids, $2 their start times, $3 ms: end those sessions (if they still run) and wait
#: for them to be gone: what each was doing has then committed, or never will.
SETTLE = (
    "SELECT count(pg_terminate_backend(a.pid, $3::bigint)) FROM pg_stat_activity a"
    " JOIN unnest($1::int[], $2::timestamptz[]) AS d(pid, started)"
    " ON a.pid = d.pid AND a.backend_start = d.started"
)
#: A session: its server process id and when it started.
Identity = tuple[int, datetime.datetime]


def server_timeouts(op_timeout: float) -> dict[str, str]:
    """The session parameters that bound what the server does for a client gone away."""
    ms = max(1, math.ceil(op_timeout * 1000))
    return {
        "statement_timeout": str(ms),
        "idle_in_transaction_session_timeout": str(2 * ms),
    }


class Session:
    """A pooled connection and its prepared statements (each prepared once per session; a
    prepared statement gives both the rows and the status, so the rows a write changed)."""

    __slots__ = ("_prepared", "committing", "conn", "identity")

    def __init__(self, conn: asyncpg.Connection, identity: Identity) -> None:
        self.conn = conn
        #: The server process of the session, and when it started (a pid alone may be reused).
        self.identity = identity
        self._prepared: dict[str, Any] = {}
        #: COMMIT was sent: if its answer is lost, the transaction may have committed.
        self.committing = False

    @classmethod
    async def open(cls, conn: asyncpg.Connection) -> Session:
        try:
            started = await conn.fetchval(_STARTED)
        except BaseException:
            conn.terminate()
            raise
        return cls(conn, (conn.get_server_pid(), started))

    async def execute(self, sql: str, params: tuple[Any, ...]) -> tuple[int, list[Any]]:
        statement = self._prepared.get(sql)
        if statement is None:
            statement = self._prepared[sql] = await self.conn.prepare(sql)
        rows = await statement.fetch(*params)
        status: str = statement.get_statusmsg()  # e.g. "UPDATE 1", "INSERT 0 1"
        tail = status.rpartition(" ")[2]
        return (int(tail) if tail.isdigit() else 0), rows

    async def run(self, script: Script[T], *, write: bool) -> T:
        if not write:
            return await run_script_async(self.execute, script)
        await self.conn.execute("BEGIN")
        result = await run_script_async(self.execute, script)
        self.committing = True
        await self.conn.execute("COMMIT")
        self.committing = False
        return result


class Pool:
    """At most ``size`` sessions; an idle one is lent again, a failed one is terminated.
    ``translate(what)``: the backend's one translation of asyncpg's errors."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        size: int,
        translate: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self._connect = connect
        self._translate = translate
        self._idle: list[Session] = []
        self._slots = asyncio.Semaphore(size)
        self.closed = False
        #: Sessions whose call was cut short (cancelled, timed out, lost): what they were
        #: doing may still commit on the server (see :meth:`settle`); the last 64.
        self.doubtful: InDoubt[Identity] = InDoubt(keep=64)

    async def run(self, script: Callable[[], Script[T]], *, write: bool, what: str = "call") -> T:
        """``script()`` on a lent session, its errors translated; again (the core's
        :func:`~aiodlock._retry.retrying`) on a new one when an idle session turned out dead
        on the first attempt, before COMMIT was sent (the server restarted or ended it:
        nothing was written; every idle session goes with it; once), and after a deadlock or
        a serialization failure (rolled back by the server: until the caller's time is up).
        The caller bounds the time."""
        runs, stale = 0, False

        async def attempt() -> T:
            nonlocal runs, stale
            runs += 1
            session: Session | None = None
            reused = False
            try:
                with self._translate(what):
                    async with self._slots:
                        if self.closed:
                            raise BackendError(CLOSED)
                        while self._idle and session is None:
                            session = self._idle.pop()
                            if session.conn.is_closed():
                                session = None
                        reused = session is not None
                        if session is None:
                            session = await Session.open(await self._connect())
                        try:
                            result = await session.run(script(), write=write)
                        except BaseException as exc:
                            session.conn.terminate()
                            if not isinstance(exc, asyncpg.PostgresError):  # (no answer)
                                self.doubtful.note(session.identity)
                            raise
                        self._give_back(session)
                        return result
            except BackendError as error:
                # An idle session the server ended (a restart), on the first attempt only (a
                # new session that fails: no stale one to blame): the other idle ones are
                # likely gone too, even if they do not know it yet.
                lost = isinstance(error.__cause__, _LOST)
                stale = runs == 1 and reused and lost and not (session and session.committing)
                if stale:
                    self._drop_idle()
                raise

        def again(error: BackendError) -> bool:
            return stale or isinstance(error.__cause__, _AGAIN)

        try:
            return await attempt()  # (the common case, without the retry loop's frame)
        except BackendError as error:
            if not again(error):
                raise
        return await retrying(
            attempt, retry_if=again, what=f"postgres {what}", first=0.001, cap=0.05
        )

    def settle(self) -> Script[None]:
        """End the sessions in doubt and wait until they are gone (before a clean-up: a
        statement still running there could otherwise commit AFTER the clean-up read)."""
        doubtful, ms = self.doubtful.recent(), 1000
        yield Fetch(SETTLE, ([d[0] for d in doubtful], [d[1] for d in doubtful], ms))
        self.doubtful.forget(doubtful)

    def _give_back(self, session: Session) -> None:
        if self.closed:
            session.conn.terminate()
        else:
            self._idle.append(session)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for session in idle:
            session.conn.terminate()

    async def aclose(self) -> None:
        self.closed = True
        self._drop_idle()
