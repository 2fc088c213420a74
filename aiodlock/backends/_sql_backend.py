"""The :class:`Backend` methods of the lock table, shared by the SQL backends.

:mod:`aiodlock.backends._sql` writes the algorithm as scripts; this class maps the
contract onto them.  A SQL backend adds only its connection: :meth:`LockTableBackend._run`,
which runs a READ script outside any write transaction and then, only if the read did not
answer (returned ``None``), a WRITE script in one transaction.  A poll that finds a live
holder, or a clean-up that finds nothing, so costs no write lock.  Where the table has a
fast path (:mod:`aiodlock.backends._sql_fast`: one INSERT, one DELETE), an attempt that is
not in the line of waiters, and every release, try it first (one statement, its own
transaction); the scripts decide what it leaves to them.

A waiter polls with capped, jittered backoff (nothing tells another process that a row
went); a release in THIS process wakes a local waiter at once through the wake-up board that
the backends of one event loop share per database (:class:`~aiodlock._wakeup.SharedBoard`).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, TypeVar, cast

from .._types import Busy, Grant, LockStatus, Request, Waiter, monotonic
from .._wakeup import Backoff, BoardWaiter, SharedBoard, WakeupBoard
from ._base import Backend
from ._sql import Behind, Granted, LockTable, Script
from ._sql_fast import FastPath

__all__ = ["LockTableBackend", "PollingBackend"]

T = TypeVar("T")
MakeScript = Callable[[], Script[Any]]


class PollingBackend(Backend):
    """A backend whose waiters poll with backoff, and whose releases in this process wake a
    local waiter at once (the board the backends of one loop share per database)."""

    poll_min: float
    poll_max: float
    _shared: SharedBoard | None = None

    def _join_board(self, resource: Hashable) -> None:
        if self._shared is None:
            self._shared = SharedBoard.join(resource)

    def _leave_board(self) -> None:
        if self._shared is not None:
            self._shared.leave()
            self._shared = None

    @property
    def board(self) -> WakeupBoard | None:
        """The local waiters of this database (shared by this loop's backends)."""
        return self._shared.board if self._shared is not None else None

    def board_key(self, name: str) -> str:
        """The key of ``name`` on :attr:`board` (a namespace has no NUL: unambiguous)."""
        return f"{self.config.namespace}\0{name}"

    def _wake_one(self, name: str) -> None:
        if self._shared is not None:
            self._shared.wake_one(self.board_key(name))

    @contextlib.asynccontextmanager
    async def _waiting(self, request: Request) -> AsyncIterator[Waiter]:
        board = self.board or WakeupBoard()
        slot = board.add(self.board_key(request.name), request.owner)  # (tagged: see Behind)
        try:
            yield BoardWaiter(slot, Backoff(first=self.poll_min, cap=self.poll_max))
        finally:
            board.remove(slot)

    def waiter(self, request: Request) -> AbstractAsyncContextManager[Waiter]:
        return self._waiting(request)


class LockTableBackend(PollingBackend):
    """A backend whose locks are rows of a :class:`LockTable` (subclass: connect, ``_run``)."""

    #: ``abandon`` reads before it deletes (True where a read sees every write that came
    #: before it, as SQLite's one connection does; an InnoDB read does not wait for a
    #: transaction still committing on a discarded connection, so MySQL deletes at once).
    abandon_reads_first: ClassVar[bool] = True

    table: LockTable
    #: The table's one-statement attempt and release (its scripts run as READ ones: each
    #: statement is its own transaction), where the backend uses it.
    fast_path: FastPath | None = None

    @abc.abstractmethod
    async def _run(self, what: str, read: MakeScript | None, write: MakeScript | None) -> Any:
        """Run ``read()`` (no write lock), then ``write()`` in one write transaction unless
        the read returned something other than ``None``; the last script's outcome."""

    async def _fast(self, what: str, statement: Callable[[], Script[T]]) -> T:
        """Run one of :attr:`fast_path`'s one-statement scripts (its own transaction); a
        backend may give them a leaner way than :meth:`_run`'s."""
        return cast(T, await self._run(what, statement, None))

    async def _grab(self, name: str, owner: str, ttl: float) -> Granted | None:
        """:attr:`fast_path`'s grab (a backend may send it in a leaner way)."""
        fast = self.fast_path
        assert fast is not None
        return await self._fast("acquire", lambda: fast.grab(name, owner, ttl))

    async def _drop(self, name: str, owner: str, token: int) -> bool | None:
        """:attr:`fast_path`'s drop (a backend may send it in a leaner way)."""
        fast = self.fast_path
        assert fast is not None
        return await self._fast("release", lambda: fast.drop(name, owner, token))

    async def _read(self, what: str, read: Callable[[], Script[T]]) -> T:
        return cast(T, await self._run(what, read, None))

    async def _write(self, what: str, write: Callable[[], Script[T]]) -> T:
        return cast(T, await self._run(what, None, write))

    # -- the contract ---------------------------------------------------------------------------

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        started = monotonic()
        name, owner, ttl = request.name, request.owner, request.ttl
        outcome: Granted | Busy | Behind | None = None
        fast = self.fast_path
        if will_wait and (request.fair or request.urgent):
            # A place in the line of waiters, kept while the waiter polls (it dies with it).
            request.queued = True
            keep = max(1.0, 20 * self.poll_max)
            outcome = await self._write(
                "acquire", lambda: self.table.attempt(name, owner, ttl, queue=keep)
            )
        else:
            if fast is not None:
                # The common case in one statement; the scripts below decide the rest.
                outcome = await self._grab(name, owner, ttl)
            if outcome is None:
                outcome = await self._run(
                    "acquire",
                    lambda: self.table.probe(name, owner),
                    lambda: self.table.attempt(name, owner, ttl),
                )
        if isinstance(outcome, Behind):
            await self._pass_on(name, outcome.head)
            return Busy()
        if isinstance(outcome, Busy):
            return outcome
        return Grant(name, owner, outcome.token, started + request.ttl)

    async def _pass_on(self, name: str, head: str) -> bool:
        """The name is free for ``head``, the first in line, but this attempt was made instead
        (a release woke this owner, or none): wake ``head`` if it waits here.  Did it?  (A
        backend whose releases call waiters in other processes calls it there too.)"""
        board = self.board
        return board is not None and board.wake_tagged(self.board_key(name), head)

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        if not grants:
            return []
        items = [(g.name, g.owner, g.token) for g in grants]
        started = monotonic()
        renewed = await self._write("renew", lambda: self.table.renew(items, ttl))
        return [started + ttl if ok else None for ok in renewed]

    async def release(self, grant: Grant) -> bool:
        name, owner, token = grant.name, grant.owner, grant.token
        released: bool | None = None
        if self.fast_path is not None:
            released = await self._drop(name, owner, token)
        if released is None:
            released = await self._write("release", lambda: self.table.release(name, owner, token))
        self._wake_one(grant.name)  # even if the row had expired: the name is free now
        return released

    async def abandon(self, request: Request) -> None:
        name, owner = request.name, request.owner
        read = (lambda: self.table.left_nothing(name, owner)) if self.abandon_reads_first else None
        deleted: bool = await self._run("abandon", read, lambda: self.table.abandon(name, owner))
        if deleted:
            self._wake_one(name)

    async def status(self, name: str) -> LockStatus | None:
        held = await self._read("status", lambda: self.table.status(name))
        return None if held is None else LockStatus(name, held.owner, held.token, held.expires_in)

    async def force_release(self, name: str) -> bool:
        released = await self._write("force_release", lambda: self.table.force_release(name))
        self._wake_one(name)
        return released
