"""The listener connection of a client: LISTEN on the namespace's channel and on its own,
waking the local waiter of the key a NOTIFY names; its place in the line of waiters."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg

from ..._errors import BackendError
from ..._shield import finish
from ..._types import monotonic
from ..._wakeup import Backoff, BoardWaiter, Heartbeat, WakeupBoard
from . import _statements as sql
from ._connection import close_quietly
from ._settings import Settings

__all__ = ["Listener"]

T = TypeVar("T")


class Listener:
    """The LISTEN connection.  A client waiting for a key has a row in the waiters table (the
    key, this session's pid) while any of its tasks waits for it; a release NOTIFYs the key on
    the channel of the client that waited longest (``{channel}_{pid}``), and that client
    alone hears it and wakes ONE waiter of the key (its board is keyed by the key as text).
    It also listens on the namespace's channel, for what every client must hear.  Opened by
    the first waiter; when it ends while tasks wait, it is opened again in the background
    (and their places in line taken again), the waiters polling meanwhile.  ``urgent``: the
    line has urgent rows (the advisory strategy's), which a passed-on call serves first;
    ``mark``: a row in a line comes with the key's line mark (the advisory strategy's: see
    :data:`~._statements.MARK`)."""

    def __init__(
        self,
        settings: Settings,
        channel: str,
        waiters: str,
        *,
        urgent: bool = False,
        mark: bool = False,
        holds: Callable[[int], bool] | None = None,
        clients: bool = False,
    ) -> None:
        self._settings = settings
        #: ``holds(key)``: this client holds the key (given: a call for a key this client
        #: neither waits for nor holds is passed on, see :meth:`_notified`).
        self._holds = holds
        #: Tasks of this listener's own (a forwarded call, a leave after a grant): cancelled
        #: by close().
        self._background: set[asyncio.Task[None]] = set()
        #: Leaves of a line after a grant, under way (see :meth:`settled`).
        self._leaving: dict[int, asyncio.Task[None]] = {}
        self.channel = channel
        self.op_timeout = settings.config.op_timeout
        self._join = sql.join_line(waiters, mark=mark, client=clients)
        #: (``clients``) the id of this client, which its rows in line name (set by the
        #: first waiter: see :meth:`waiter`)
        self._clients = clients
        self.client: str | None = None
        #: leaving, by a client in the line (it gives its line mark back, if ``mark``) and
        #: by one whose row went already (a forwarded call)
        self._leave = {True: sql.leave_line(waiters, mark=mark), False: sql.leave_line(waiters)}
        self._pass_on = {
            True: sql.pass_on(waiters, urgent, mark=mark),
            False: sql.pass_on(waiters, urgent),
        }
        self.board = WakeupBoard()
        self.conn: asyncpg.Connection | None = None
        self.pid = 0  # the LISTEN session's server process
        #: Keys this session has a row for in the waiters table, and since when.
        self.joined: dict[int, float] = {}
        #: Keys whose local waiter a call woke since the key's last attempt (see take_call).
        self._called: set[int] = set()
        self.closed = False
        #: Counters (for tests and benchmarks): NOTIFY messages heard, and those that woke one.
        self.heard = 0
        self.woke = 0
        self._mutex = asyncio.Lock()
        self._relisten = Heartbeat(self._rejoin, "aiodlock:postgres-listen")
        self._pauses = Backoff(0.05, 1.0)
        #: The session closes ``idle`` seconds after the last local waiter left (every NOTIFY
        #: of the database wakes every LISTENing session, so an idle one costs the server).
        self.idle = settings.listen_idle
        self._idle_since = 0.0
        self._idler = Heartbeat(self._close_if_idle, "aiodlock:postgres-listen-idle")

    def listening(self) -> bool:
        return self.conn is not None and not self.conn.is_closed()

    def listening_for(self, key: int) -> bool:
        return key in self.joined and self.listening()

    def take_call(self, key: int) -> bool:
        """Was a local waiter of ``key`` woken by a call since the key's last attempt (which
        this one is)?"""
        if key in self._called:
            self._called.discard(key)
            return True
        return False

    @contextlib.asynccontextmanager
    async def waiter(
        self, key: int, backoff: Backoff, tag: object = None, client: str | None = None
    ) -> AsyncIterator[BoardWaiter]:
        """A local waiter of ``key`` (``tag``: what a wake-up meant for it alone names;
        ``client``: the id of this client, for a listener of ``clients``): on the board, in
        the line of ``key`` while any local waiter is; it polls with ``backoff`` while a
        release would not reach it."""
        if client is not None:
            self.client = client
        slot = self.board.add(str(key), tag)
        try:
            since = None
            # (unable to listen, it polls until the listener is back)
            with contextlib.suppress(BackendError), self._settings.translate("listen"):
                since = await self.join(key)
            waiter = BoardWaiter(slot, backoff, functools.partial(self.listening_for, key))
            waiter.listening_since = since
            yield waiter
        finally:
            called = slot.event.is_set()  # (a wake-up it did not use)
            self.board.remove(slot)  # (which hands it to another local waiter, if any)
            if not self.board.count(str(key)):
                if self._holds is not None and self._holds(key) and not self.closed:
                    # Granted: the place in line goes while the lock is held, not on the
                    # hand-off's path; a release of the key waits for it (see settled()).
                    self._start(self._leave_after_grant(key, called), leaving=key)
                else:
                    # (to its end, even if the task is cancelled again meanwhile: a call it
                    # passes on must reach the next client)
                    try:
                        await finish(self._leave_quietly(key, called))
                    finally:
                        self._went_idle()

    def _start(self, work: Coroutine[Any, Any, None], leaving: int | None = None) -> None:
        """Run ``work`` in a task of this listener's own (``leaving``: a leave of that key's
        line, which :meth:`settled` waits for)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if leaving is not None:
            self._leaving[leaving] = task

    async def _leave_after_grant(self, key: int, called: bool) -> None:
        try:
            await self._leave_quietly(key, called)
        finally:
            if self._leaving.get(key) is asyncio.current_task():
                del self._leaving[key]
            self._went_idle()

    async def settled(self, key: int) -> None:
        """(before a release of ``key``) Wait for its line's leave after the grant, if it is
        under way: the release must not find this client's own place in line."""
        task = self._leaving.get(key)
        if task is not None:
            await asyncio.wait((task,))

    def _went_idle(self) -> None:
        """(a local waiter left) No waiter left: the session closes in ``idle`` seconds,
        unless another comes first."""
        if not self.board.names() and not self.closed:
            self._idle_since = monotonic()
            self._idler.start(self.idle)

    async def _close_if_idle(self) -> float | None:
        """(the idle heartbeat) Close the session once no local waiter has come for ``idle``
        seconds; the pause before looking again, or None: done (a waiter that comes keeps
        the session, and starts this again when it leaves)."""
        if self.closed or self.board.names():
            return None
        left = self._idle_since + self.idle - monotonic()
        if left > 0:
            return left
        async with self._mutex:  # (after a join, a leave or a passed-on call under way)
            if self.closed or self.board.names():
                return None
            conn, self.conn, self.pid = self.conn, None, 0
            self.joined.clear()  # (rows left behind, if any, end with the session)
        if conn is not None:
            await finish(close_quietly(conn, self.op_timeout))
        return None

    async def _leave_quietly(self, key: int, called: bool) -> None:
        with contextlib.suppress(BackendError), self._settings.translate("leave"):
            await self.leave(key, called)

    async def join(self, key: int) -> float | None:
        """Listen (one connection, one ``LISTEN``) and take a row in the line of ``key``;
        since when a release of it reaches this client (None: it does not)."""
        if self.listening_for(key) or self.closed:
            return self.joined.get(key)
        async with self._mutex:
            conn = self.conn
            if conn is None or conn.is_closed():
                conn = await self._listen()
            if conn is not None and key not in self.joined:
                args = (key, self.client) if self._clients else (key,)
                try:
                    await self._call(conn, conn.execute(self._join, *args))
                except BaseException:
                    # (a row may have been made for nobody: end the session, its rows die)
                    conn.terminate()
                    raise
                self.joined[key] = monotonic()
                if not self.board.count(str(key)):
                    # (its waiters left meanwhile: a re-LISTEN in the background raced them)
                    await self._leave_line(conn, key, False)
        return self.joined.get(key)

    async def leave(self, key: int, called: bool = False) -> None:
        """The last local waiter of ``key`` left: leave its line (a failure ends the LISTEN
        session, whose rows then count as gone); ``called``: it left with a wake-up it did
        not use, which goes to the next client in line."""
        if self.board.count(str(key)):
            return
        async with self._mutex:  # (after a join under way, if any)
            conn = self.conn
            if key not in self.joined or self.board.count(str(key)) or conn is None:
                return
            await self._leave_line(conn, key, called)

    async def _leave_line(self, conn: asyncpg.Connection, key: int, called: bool) -> None:
        """Leave the line of ``key`` (``called``: passing an unused call on to the next
        client); a failure ends the LISTEN session, whose rows then count as gone."""
        joined = self.joined.pop(key, None) is not None
        try:
            if called:
                await self._call(conn, conn.execute(self._pass_on[joined], key, self.channel))
            else:
                await self._call(conn, conn.execute(self._leave[joined], key))
        except BaseException:
            conn.terminate()
            raise

    async def _call(self, conn: asyncpg.Connection, step: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.op_timeout):
                return await step
        except TimeoutError:
            conn.terminate()
            raise

    async def _listen(self) -> asyncpg.Connection | None:
        conn = await self._settings.connect()
        try:
            own = f"{self.channel}_{conn.get_server_pid()}"
            for channel in (own, self.channel):
                await self._call(conn, conn.add_listener(channel, self._notified))
        except BaseException:
            conn.terminate()
            raise
        if self.closed:
            conn.terminate()
            return None
        conn.add_termination_listener(self._terminated)
        self.conn, self.pid = conn, conn.get_server_pid()
        return conn

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        """``"key"``: wake one waiter of the key; ``"key owner"``: wake that owner's waiter,
        if it waits here (the first in a line: told to every client waiting for the key)."""
        self.heard += 1
        key, _, owner = payload.partition(" ")
        if self.board.wake_tagged(key, owner) if owner else self.board.wake_one(key):
            self.woke += 1
            self._called.add(int(key))
        elif (
            self._holds is not None
            and not owner
            and not self.closed
            and not self.board.count(key)
            and not self._holds(int(key))
        ):
            # A call for a key this client no longer waits for (its waiter left, or is
            # leaving, as the call was on its way: e.g. another client's attempt, barred by
            # this client's place in line, found the lock free and called it): the next
            # client in line must not lose it.  (One that holds the key calls the next itself.)
            self._start(self._forward(int(key)))

    async def _forward(self, key: int) -> None:
        with contextlib.suppress(Exception):
            async with self._mutex:
                conn = self.conn
                if conn is None or self.closed or self.board.count(str(key)):
                    return  # (a waiter came back: the call is its own)
                # (pass_on deletes the row, if it is still there)
                await self._leave_line(conn, key, True)

    def _terminated(self, conn: Any) -> None:
        if conn is self.conn:
            self.conn, self.pid = None, 0
            self.joined.clear()
            for key in self.board.names():
                self.board.wake_all(key)  # releases may go unheard: ask again, then poll
                self._called.add(int(key))  # (as if called: a call may have been lost)
            if self.board.names() and not self.closed:
                self._pauses.reset()
                self._relisten.start(0.0)

    async def _rejoin(self) -> float | None:
        """(the heartbeat, while tasks wait and the session is gone) LISTEN again and take
        their places in line again; the pause before the next try, or None: done."""
        keys = [int(key) for key in self.board.names()]
        if self.closed or not keys:
            return None
        try:
            with self._settings.translate("listen"):
                for key in keys:
                    await self.join(key)
        except BackendError:
            return self._pauses.next()  # (the server is not back yet)
        for key in keys:
            self.board.wake_one(str(key))  # (a release while nobody listened: ask again)
        return None

    async def close(self) -> None:
        self.closed = True
        self._relisten.stop()
        await self._idler.aclose()  # (a close under way ends first)
        for task in list(self._background):
            task.cancel()
        conn, self.conn = self.conn, None
        self.joined.clear()
        if conn is not None:
            await close_quietly(conn, self.op_timeout)
