"""The holder connection of a client (every advisory lock of the client lives on its
session; asyncpg runs one statement at a time on a connection), and what both connections
of a client share (the listener's is :mod:`._listener`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from ..._errors import BackendError
from ..._slots import Slots
from ..._types import monotonic
from ..._wakeup import Timer

__all__ = ["CLOSED", "Holder", "close_quietly"]

T = TypeVar("T")
Connect = Callable[[], Awaitable[asyncpg.Connection]]
#: ``(generation, reason)``: the holder connection of that generation ended.
OnEnd = Callable[[int, str], None]

CLOSED = "postgres: the client is not open (or was closed)"


async def close_quietly(conn: asyncpg.Connection, timeout: float) -> None:
    """Close ``conn`` within ``timeout``, else terminate it."""
    try:
        async with asyncio.timeout(timeout):
            await conn.close()
    except Exception:
        conn.terminate()


class Holder:
    """The holder connection: one statement at a time (:meth:`begin` / :meth:`end` around
    it), each bounded by ``op_timeout``.  A connection that did not answer in time is
    discarded (its state is unknown); its end, by us, the server or the network, goes to
    ``on_end(generation, reason)``: every advisory lock of its session ended with it.  While
    ``needed()`` (locks are held), a keep-alive sends ``SELECT 1`` after ``op_timeout / 2`` of
    silence, bounded by ``op_timeout / 2``: a server that stops answering is found within
    ``op_timeout``.  Both deadlines run on ONE timer (the core's :class:`Timer`), not one
    per statement."""

    def __init__(
        self, connect: Connect, op_timeout: float, on_end: OnEnd, needed: Callable[[], bool]
    ) -> None:
        self._connect = connect
        self.op_timeout = op_timeout
        self._on_end = on_end
        self._needed = needed
        self.conn: asyncpg.Connection | None = None
        #: Counts the connection's lives (a grant remembers the one it was made on).
        self.generation = 0
        self.pid: int | None = None  # the server process of the session
        self.closed = False
        self._mutex = Slots(1)
        self._last = 0.0  # when the server last answered
        self._timer = Timer(self._due)
        self._ping: asyncio.Task[None] | None = None
        #: The statement in flight: its deadline and bound (None: none in flight).
        self._deadline: float | None = None
        self._wait = 0.0
        self._timed_out: asyncpg.Connection | None = None

    async def begin(self, *, connect: bool = True) -> asyncpg.Connection | None:
        """The connection, for this task alone until :meth:`end` (opened when ``connect``
        and there is none)."""
        if not self._mutex.take_now():
            await self._mutex.take()
        try:
            if self.closed:
                raise BackendError(CLOSED)
            conn = self.conn
            if conn is None and connect:
                conn = await self._open()
            return conn
        except BaseException:
            self._mutex.give()
            raise

    def end(self) -> None:
        self._mutex.give()

    @contextlib.asynccontextmanager
    async def session(self, *, connect: bool = True) -> AsyncIterator[asyncpg.Connection | None]:
        """:meth:`begin` ... :meth:`end` (off the hot paths)."""
        conn = await self.begin(connect=connect)
        try:
            yield conn
        finally:
            self.end()

    async def _open(self) -> asyncpg.Connection:
        conn = await self._connect()
        if self.closed:
            conn.terminate()
            raise BackendError(CLOSED)
        self.generation += 1
        self.conn, self.pid, self._last = conn, conn.get_server_pid(), monotonic()
        conn.add_termination_listener(self._terminated)
        return conn

    async def call(self, conn: asyncpg.Connection, step: Awaitable[T], timeout: float = 0) -> T:
        """Await ``step`` (a statement on ``conn``) within ``timeout`` (op_timeout); past it
        the connection is discarded and TimeoutError raised."""
        self._wait = wait = timeout or self.op_timeout
        self._deadline = deadline = monotonic() + wait
        self._timer.at(deadline)
        try:
            result = await step
        except Exception as exc:
            if self._timed_out is conn:
                raise TimeoutError(f"no answer within {wait:g} s") from exc
            raise
        finally:
            self._deadline = None
        self._last = monotonic()
        return result

    def discard(self, conn: asyncpg.Connection, reason: str) -> None:
        """Drop ``conn`` (its state is unknown): its session, and its locks, end."""
        if conn is self.conn:
            self._end(reason)
        conn.terminate()

    def _terminated(self, conn: Any) -> None:
        if conn is self.conn:
            self._end("the connection to the server was lost (a restart, a terminated session)")

    def _end(self, reason: str) -> None:
        generation = self.generation
        self.conn = self.pid = None
        self.generation += 1
        self._timer.cancel()
        self._on_end(generation, reason)

    def keep_alive(self) -> None:
        """Locks are held: make sure the keep-alive runs."""
        if self.conn is not None:
            self._timer.at(self._last + self.op_timeout / 2)

    def _due(self, now: float) -> float | None:
        conn = self.conn
        if conn is None or self.closed:
            return None
        if self._deadline is not None:  # a statement in flight
            if now < self._deadline:
                return self._deadline
            self._timed_out = conn
            self.discard(conn, f"the server did not answer within {self._wait:g} s")
            return None
        if not self._needed():
            return None
        due = self._last + self.op_timeout / 2
        if due > now:
            return due
        if self._ping is None or self._ping.done():
            self._ping = asyncio.get_running_loop().create_task(self._send_ping())
        return None  # (the ping's statement sets the timer again)

    async def _send_ping(self) -> None:
        with contextlib.suppress(Exception):
            conn = await self.begin(connect=False)
            try:
                if conn is not None and self._last + self.op_timeout / 2 <= monotonic():
                    await self.call(conn, conn.fetchval("SELECT 1"), self.op_timeout / 2)
                elif conn is not None:
                    self.keep_alive()
            finally:
                self.end()

    async def close(self) -> None:
        self.closed = True
        self._timer.cancel()
        if self._ping is not None:
            self._ping.cancel()
        conn, self.conn, self.pid = self.conn, None, None
        self.generation += 1
        if conn is not None:
            await close_quietly(conn, self.op_timeout)
