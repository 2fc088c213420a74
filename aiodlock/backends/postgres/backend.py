"""``postgresql://user:pw@host:5432/db`` (alias ``postgres://``): session-level advisory locks.

A name's lock is ``pg_try_advisory_lock(key)``, ``key`` a 64-bit hash of namespace and name
(:func:`._statements.lock_key`), taken on the client's ONE holder connection; the same
statement bumps the key's counter row (the fencing token) only when the lock was taken.  A
release unlocks and, only when a client waits for the key, NOTIFYs the one that has waited
longest; each client LISTENs on one connection and wakes only its local waiter of that key.
An urgent waiter (Capability.URGENT) marks its client's row in the line of waiters: no other
client's attempt takes the key past it, and a release calls it first.
The lease is the holder session: its end is the loss of every lock on it.
:meth:`PostgresBackend.from_url` builds :mod:`.table`'s backend for ``strategy=table``.  See
docs/backends/postgres.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Self, cast

import asyncpg

from ..._errors import BackendError
from ..._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LockStatus,
    LostCallback,
    Request,
    Waiter,
    monotonic,
)
from ..._url import ParsedURL, take_str
from ..._wakeup import Backoff
from .._base import Backend
from . import _statements as sql
from ._connection import CLOSED, Holder
from ._listener import Listener
from ._settings import CREATE_RACE, Settings

__all__ = ["PostgresBackend"]

#: A statement that raised one of these ended with its session (a timeout discards it).
_SESSION_ENDED = (
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
    ConnectionError,
    TimeoutError,
)


@dataclasses.dataclass(frozen=True, slots=True)
class _Held:
    """A grant's ``data``: its key, the life of the holder connection it was made on, and
    whether a client was in the key's line when it was taken (its release then calls the
    next one in the same statement: see :meth:`PostgresBackend._unlock`)."""

    key: int
    generation: int
    contended: bool = False


class PostgresBackend(Backend):
    """Advisory locks on one holder session per client, woken by LISTEN/NOTIFY."""

    backend_name = "postgres"
    capabilities = (
        Capability.FENCING | Capability.SESSION_LEASE | Capability.CROSS_PROCESS | Capability.URGENT
    )

    def __init__(self, config: CommonConfig, settings: Settings, options: dict[str, Any]) -> None:
        self.config = config
        self.settings = settings
        self.strategy, self.host, self.port = settings.strategy, settings.host, settings.port
        self.database, self.user, self.sslmode = settings.database, settings.user, settings.sslmode
        table = take_str(options, "table", "aiodlock_tokens") or "aiodlock_tokens"
        self.table = table
        self._table = sql.quote_ident(table)
        self._waiters = sql.quote_ident(f"{table}_waiters")
        self._unlock_sql = sql.UNLOCK
        self._unlock_calling = sql.unlock_calling(self._waiters)
        self._call_next = sql.call_next(self._waiters)
        self.poll_interval = settings.poll_interval
        self.channel = sql.channel_of(config.namespace)
        #: the attempt of a client not in the key's line (when nobody is in it, and when
        #: somebody is), and of one in it
        self._try_free = sql.try_free(self._table)
        self._try_lock = sql.try_lock(self._table, self._waiters, in_line=False)
        self._try_in_line = sql.try_lock(self._table, self._waiters, in_line=True)
        self._status = sql.status(self._table)
        self._acquiring = settings.translate("acquire")
        self._releasing = settings.translate("release")
        self._on_lost: LostCallback | None = None
        self._holder: Holder | None = None
        self._listener: Listener | None = None
        #: key -> the grant held on the holder session (one owner per key: advisory locks
        #: stack per session, so the client itself keeps its tasks apart)
        self._held: dict[int, Grant] = {}
        #: key -> (owner, generation) of an attempt whose answer was lost (it may hold it)
        self._doubt: dict[int, tuple[str, int]] = {}

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        settings = Settings(config, url, options)
        # (the scheme's one class builds the strategy's backend: the core only calls it)
        if settings.strategy == "table":
            from .table import PostgresTableBackend

            return cast(Self, PostgresTableBackend(config, settings, options))
        return cls(config, settings, options)

    def describe(self) -> str:
        return self.settings.describe()

    def key(self, name: str) -> int:
        """The advisory lock key of ``name`` in this client's namespace."""
        return sql.lock_key(self.config.namespace, name)

    def _translate(self, what: str) -> contextlib.AbstractContextManager[None]:
        return self.settings.translate(what)

    async def _connect(self) -> asyncpg.Connection:
        return await self.settings.connect()

    @property
    def holder(self) -> Holder:
        if self._holder is None:
            raise BackendError(CLOSED)
        return self._holder

    @property
    def listener(self) -> Listener:
        if self._listener is None:
            raise BackendError(CLOSED)
        return self._listener

    async def open(self, on_lost: LostCallback) -> None:
        self._on_lost = on_lost
        op = self.config.op_timeout
        self._holder = Holder(self._connect, op, self._ended, lambda: bool(self._held))
        self._listener = Listener(
            self.settings,
            self.channel,
            self._waiters,
            urgent=True,
            mark=True,
            holds=lambda key: key in self._held,
        )
        try:
            async with self.holder.session() as conn:
                assert conn is not None
                with self._translate("create the token table"):
                    for create in (
                        sql.create_table(self._table),
                        sql.create_waiters(self._waiters),
                    ):
                        try:
                            await self.holder.call(conn, conn.execute(create))
                        except CREATE_RACE:
                            pass  # another client created it at the same moment
                    has = conn.fetchval(sql.HAS_URGENT, self._waiters)
                    if not await self.holder.call(conn, has):
                        # (a line made before the urgent mark: the exclusive lock, once)
                        add = conn.execute(sql.add_urgent(self._waiters))
                        with contextlib.suppress(*CREATE_RACE):
                            await self.holder.call(conn, add)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        holder, listener = self._holder, self._listener
        self._holder = self._listener = None
        held, self._held = list(self._held.values()), {}
        self._doubt.clear()
        if held and self._on_lost is not None:
            self._on_lost(held, "the client was closed while the lock was held")
        if listener is not None:
            await listener.close()
        if holder is not None:
            await holder.close()  # its session ends: the server frees its locks

    def _ended(self, generation: int, reason: str) -> None:
        """The holder session of ``generation`` ended: so did every lock on it."""
        lost = [g for g in self._held.values() if g.data.generation == generation]
        for grant in lost:
            del self._held[grant.data.key]
        self._doubt = {k: v for k, v in self._doubt.items() if v[1] != generation}
        if self._listener is not None:
            for grant in lost:  # local waiters ask again (no NOTIFY comes from a dead session)
                self._listener.board.wake_all(str(grant.data.key))
        if lost and self._on_lost is not None:
            self._on_lost(lost, f"postgres: {reason}")

    def _busy(self) -> Busy:
        # The holder's session may end without a NOTIFY (a killed process): ask again after
        # about poll_interval even when no release is heard.
        return Busy(random.uniform(self.poll_interval / 2, self.poll_interval))

    def _taken_here(self, key: int, request: Request) -> Grant | Busy:
        """(``key`` is held on the holder session, or an attempt of it is in doubt) the
        grant again, for a retried attempt of its owner; else busy."""
        grant = self._held.get(key)
        if grant is not None and grant.owner == request.owner and grant.name == request.name:
            return grant  # (a retried attempt: the same grant)
        return self._busy()

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        key = sql.lock_key(self.config.namespace, request.name)
        if key in self._held or key in self._doubt:
            return self._taken_here(key, request)
        holder, listener = self._holder, self._listener
        if holder is None or listener is None:
            raise BackendError(CLOSED)
        with self._acquiring:
            conn = await holder.begin()
            try:
                assert conn is not None
                if key in self._held or key in self._doubt:  # (while this task waited its turn)
                    return self._taken_here(key, request)
                generation = holder.generation
                self._doubt[key] = (request.owner, generation)
                try:
                    name, owner = sql.encode(request.name), sql.encode(request.owner)
                    called = listener.take_call(key)  # (taken by every attempt: about this one)
                    contended = listener.listening_for(key)
                    if contended:
                        # (in the line: an urgent request marks its client's row)
                        args = (
                            key,
                            name,
                            owner,
                            listener.pid,
                            self.channel,
                            request.urgent,
                            called,
                        )
                        token = await holder.call(conn, conn.fetchval(self._try_in_line, *args))
                    else:
                        # (not in line: tried as if nobody were, the line's statement only
                        # when somebody is in it)
                        step = conn.fetchrow(self._try_free, key, name, owner)
                        ok, token = await holder.call(conn, step)
                        if ok is None:
                            contended = True  # (somebody is in line)
                            step = conn.fetchval(self._try_lock, key, name, owner, listener.pid)
                            token = await holder.call(conn, step)
                except _SESSION_ENDED:
                    self._doubt.pop(key, None)  # (the session is gone, and its locks)
                    raise
                del self._doubt[key]  # (an error or a cancellation leaves it: abandon())
            finally:
                holder.end()
        if token is None:
            return self._busy()
        data = _Held(key, generation, contended)
        grant = Grant(request.name, request.owner, token, None, data)
        self._held[key] = grant
        holder.keep_alive()
        return grant

    def waiter(self, request: Request) -> AbstractAsyncContextManager[Waiter]:
        return self.listener.waiter(self.key(request.name), Backoff(0.01, self.poll_interval))

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        """The session is the lease: one ``SELECT 1`` proves it still lives."""
        started = monotonic()
        with self._translate("renew"):
            async with self.holder.session(connect=False) as conn:
                if conn is not None:
                    await self.holder.call(conn, conn.fetchval("SELECT 1"))
                generation = self.holder.generation
        return [
            started + ttl
            if self._held.get(g.data.key) is g and g.data.generation == generation
            else None
            for g in grants
        ]

    async def release(self, grant: Grant) -> bool:
        held: _Held = grant.data
        if held.contended and self._listener is not None:
            await self._listener.settled(held.key)  # (this client's place in line is gone)
        if self._held.get(held.key) is not grant:
            return False  # lost with its session, or broken by force_release
        holder = self._holder
        if holder is None:
            raise BackendError(CLOSED)
        with self._releasing:
            conn = await holder.begin(connect=False)
            try:
                if conn is None or holder.generation != held.generation:
                    return False
                del self._held[held.key]
                try:
                    released = await self._unlock(conn, held.key, held.contended)
                except BaseException as exc:
                    if not isinstance(exc, _SESSION_ENDED):
                        # Unknown whether it is still held: only ending the session is sure.
                        holder.discard(conn, f"a release was interrupted ({type(exc).__name__})")
                    raise
            finally:
                holder.end()
        return released

    async def _unlock(self, conn: asyncpg.Connection, key: int, contended: bool = True) -> bool:
        """Unlock ``key`` on the holder session; if a client waits for it, call the one that
        is urgent longest, else has waited longest.  Was it held.

        ``contended`` (somebody was in line when it was taken: somebody likely is now): the
        call is made in the same statement (:func:`~._statements.unlock_calling`), and a
        second one only when that statement's snapshot missed the client in line.  Else the
        unlock reads no table (:data:`~._statements.UNLOCK`: a plan that may read one is set
        up, and the table locked, as it starts, which would cost every release), and a
        second statement calls, when the line's mark says somebody waits."""
        if contended:
            step = conn.fetchrow(self._unlock_calling, key, self.channel)
            held, called = await self.holder.call(conn, step)
            waited = called == 0
        else:
            held, waited = await self.holder.call(conn, conn.fetchrow(self._unlock_sql, key))
        if waited:
            await self.holder.call(conn, conn.execute(self._call_next, key, self.channel))
        return bool(held)

    async def abandon(self, request: Request) -> None:
        key = self.key(request.name)
        grant = self._held.get(key)
        if grant is not None and grant.owner == request.owner:
            await self.release(grant)
            return
        doubt = self._doubt.get(key)
        if doubt is None or doubt[0] != request.owner or self._holder is None:
            return
        holder = self.holder
        with self._translate("abandon"):
            async with holder.session(connect=False) as conn:
                if conn is None or holder.generation != doubt[1]:
                    return  # the session ended: nothing of it is left
                try:
                    # Unlock what the attempt may have taken (false, and a warning, if not).
                    await self._unlock(conn, key)
                except BaseException as exc:
                    if not isinstance(exc, _SESSION_ENDED):
                        holder.discard(conn, f"a clean-up was interrupted ({type(exc).__name__})")
                    raise
                finally:
                    if self._doubt.get(key) == doubt:
                        del self._doubt[key]

    async def status(self, name: str) -> LockStatus | None:
        key = self.key(name)
        holder = self.holder
        with self._translate("status"):
            async with holder.session() as conn:
                assert conn is not None
                row = await holder.call(conn, conn.fetchrow(self._status, key))
        if row is None:
            return None
        pid, holder_name, owner, token = row
        if holder_name != sql.encode(name):  # taken outside aiodlock, or by a name with its key
            return LockStatus(name, f"(PostgreSQL session {pid})", int(token or 0), None)
        return LockStatus(name, sql.decode(owner), int(token), None)

    async def force_release(self, name: str) -> bool:
        """Unlock if this client holds it; else END the holding session (advisory locks can
        only be released by their session): every lock of that client is lost."""
        key = self.key(name)
        holder = self.holder
        with self._translate("force_release"):
            async with holder.session() as conn:
                assert conn is not None
                grant = self._held.pop(key, None)
                if grant is not None:
                    released = await self._unlock(conn, key)
                    if self._on_lost is not None:
                        self._on_lost([grant], "postgres: the lock was broken (force_release)")
                    return released
                wait_ms = int(self.config.op_timeout * 1000)
                step = conn.fetchval(sql.TERMINATE, key, wait_ms)
                ended = await holder.call(conn, step, self.config.op_timeout * 2)
                if ended:
                    await holder.call(conn, conn.execute(sql.NOTIFY, self.channel, key))
                return bool(ended)
