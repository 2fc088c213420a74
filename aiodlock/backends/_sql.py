"""The lock-table design shared by the SQL backends (SQLite, MySQL/MariaDB, PostgreSQL).

``aiodlock_locks`` holds one row per name under the unique key (namespace, name): the name
as bytes (compared byte for byte), the owner, the fencing token (the row's own
auto-increment id: a new row, a new and larger token), the expiry (server time in
microseconds), a version bumped by every write (optimistic take-over) and ``waiting``, set
while a line of waiters may exist.  A row is *held* (an owner, live), *expired*, or
*vacant* (owner ``''``: released to the first in line).  ``aiodlock_waiters`` is the line
of waiters (fair and urgent ones), oldest first.

The rule that keeps the line without a guard on the plain INSERT: **while the line has a
live waiter, the name's row exists** (held or vacant) with ``waiting = 1``.  So a plain
INSERT of a name with a line hits the duplicate key and falls back to the scripts, which
respect the head of the line; and a release that may leave a line behind (``waiting = 1``)
goes to the scripts too, which VACATE the row for the head instead of deleting it.

Every operation is a *script* (a generator of :class:`Fetch` / :class:`Execute` /
:class:`Insert` statements that returns the outcome), run on ``sqlite3`` in a worker thread
(:func:`run_script`) or on an async driver (:func:`run_script_async`).  *Write* scripts run
in one transaction that serialises writers of the row (SQLite ``BEGIN IMMEDIATE``;
``FOR UPDATE`` elsewhere), *read* scripts outside any.  A dialect with a server clock
expression also gets the fast path of :mod:`aiodlock.backends._sql_fast` (one INSERT to
take a free name, one DELETE to release it, each its own transaction).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Protocol, TypeVar

from .._types import Busy

__all__ = [
    "Behind",
    "Dialect",
    "Execute",
    "Fetch",
    "Granted",
    "Held",
    "Insert",
    "LockTable",
    "Script",
    "encode_name",
    "micros",
    "run_script",
    "run_script_async",
]

T = TypeVar("T")

#: The owner of a vacant row (an owner is never empty).
VACANT = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Fetch:
    """A query; the script receives ``list[tuple]`` (every row)."""

    sql: str
    params: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Execute:
    """A write; the script receives the number of rows it changed."""

    sql: str
    params: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Insert:
    """The INSERT of a lock row; the script receives its token (the new row's id), or
    ``None`` when the name already has a row (the duplicate key)."""

    sql: str
    params: tuple[Any, ...]


Statement = Fetch | Execute | Insert
#: A generator that yields statements, receives their results and returns an outcome.
Script = Generator[Statement, Any, T]


@dataclasses.dataclass(frozen=True, slots=True)
class Granted:
    """The name is ours with ``token`` (``refreshed``: we already held it, same token)."""

    token: int
    refreshed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Behind:
    """Busy: the name is free, but ``head`` is first in the line of waiters."""

    head: str


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    """A live row, as :meth:`LockTable.status` reads it."""

    owner: str
    token: int
    expires_in: float


def encode_name(name: str) -> bytes:
    """The stored form of a lock name: UTF-8, lone surrogates kept (any ``str`` is a name)."""
    return name.encode("utf-8", "surrogatepass")


def micros(seconds: float) -> int:
    """``seconds`` as whole microseconds (at least 1)."""
    return max(1, round(seconds * 1_000_000))


class Dialect:
    """What differs between SQL databases (subclass it; statements use ``?`` placeholders)."""

    #: Short name, e.g. ``"sqlite"``.
    name: str = "sql"
    #: The driver's placeholder (``"?"`` qmark, ``"%s"`` format); ``?`` is rewritten to it;
    #: ``"$"``: numbered, ``$1``, ``$2``, ... in order (asyncpg).
    placeholder: str = "?"
    #: Appended to the row read inside a write transaction (``" FOR UPDATE"`` on InnoDB;
    #: empty where the transaction already serialises writers, as SQLite's does).
    for_update: str = ""
    #: A query returning the server clock as integer microseconds since the epoch, or
    #: ``None`` to use the local wall clock (:func:`time.time`).
    now_sql: str | None = None
    #: The server clock as an SQL expression (integer microseconds), for statements that
    #: read it inline (the fast path needs it); ``None``: the dialect has none.
    now_expr: str | None = None
    #: How many expired rows one grant deletes at most (keeps every write short).
    sweep_limit: int = 64
    #: The SQL expression a name's parameter stands in (e.g. ``"UNHEX(?)"``).
    name_sql: str = "?"
    #: Appended to the INSERT of a lock row: where a duplicate key would abort the
    #: transaction, ``" ON CONFLICT DO NOTHING"`` (0 rows inserted instead); and where the
    #: driver does not report the new id, ``" RETURNING token"``.
    insert_suffix: str = ""

    def name_param(self, key: bytes) -> Any:
        """The parameter sent for a name's stored bytes (``name_sql`` turns it back)."""
        return key

    def create_tables(self, locks: str) -> list[str]:
        """Idempotent DDL of the lock table (``token``: an id that never repeats, even
        after the row is deleted) and its expiry index."""
        raise NotImplementedError

    def sweep_expired(self, table: str, where: str = "") -> str:
        """Delete at most :attr:`sweep_limit` rows with ``expires_at < ?`` (and the extra
        condition ``where``, written ``AND ...``, whose columns are written ``table.column``);
        params (now, then those of ``where``)."""
        raise NotImplementedError

    def create_line(self, line: str) -> list[str]:
        """Idempotent DDL of the line of waiters: ``id`` (increasing with every insert),
        namespace, name, owner, expires_at; unique (namespace, name, owner)."""
        raise NotImplementedError


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class LockTable:
    """The lock-table algorithm for one namespace, as driver-agnostic scripts.

    Invariants the scripts keep (the unique key does the rest):

    * a token is the id of a NEW row (its auto-increment), so a grant and its token commit
      or vanish together, and tokens strictly increase per name across processes and
      restarts (the id is never reused);
    * an expired or vacant row is taken over with ``DELETE ... WHERE version = ?`` and an
      INSERT (a new id) in one transaction: if anybody wrote the row since we read it,
      nothing changes and the attempt reports busy;
    * while the line has a live waiter, the row exists with ``waiting = 1`` (a waiter that
      joins marks it, or inserts a vacant one); a release with ``waiting = 1`` and a live
      line VACATES the row, and only the first in line takes a vacant or expired row;
    * an attempt by the row's own owner on a live row is idempotent: same token, new
      expiry (a retried attempt whose reply was lost must not count twice);
    * an expired or vacant row counts as free everywhere: it is never renewed, it is not
      reported by :meth:`status`, and releasing it reports ``False``.
    """

    def __init__(
        self,
        dialect: Dialect,
        namespace: str,
        *,
        locks: str = "aiodlock_locks",
        line: str = "aiodlock_waiters",
    ) -> None:
        for table in (locks, line):
            if not _IDENT.match(table):
                raise ValueError(f"bad SQL table name {table!r}")
        self.dialect = dialect
        self.namespace = namespace
        self.locks = locks
        self.line = line
        q = self.render
        cols = "owner, token, expires_at, version, waiting"
        n = dialect.name_sql
        key = f"namespace = ? AND name = {n}"
        self._select = q(f"SELECT {cols} FROM {locks} WHERE {key}")
        self._select_for_update = q(f"SELECT {cols} FROM {locks} WHERE {key}{dialect.for_update}")
        self._insert = q(
            f"INSERT INTO {locks} (namespace, name, owner, expires_at, version, waiting) "
            f"VALUES (?, {n}, ?, ?, 1, ?){dialect.insert_suffix}"
        )
        self._delete_version = q(f"DELETE FROM {locks} WHERE {key} AND version = ?")
        self._vacate = q(
            f"UPDATE {locks} SET owner = '', expires_at = ?, version = version + 1, waiting = 1 "
            f"WHERE {key} AND version = ?"
        )
        # (the version too: so that it changes the row, and reports it, even when set)
        self._mark = q(f"UPDATE {locks} SET waiting = 1, version = version + 1 WHERE {key}")
        self._refresh = q(
            f"UPDATE {locks} SET expires_at = ?, version = version + 1 "
            f"WHERE {key} AND owner = ? AND token = ? AND version = ?"
        )
        self._renew = q(
            f"UPDATE {locks} SET expires_at = ?, version = version + 1 "
            f"WHERE {key} AND owner = ? AND token = ? AND expires_at > ?"
        )
        live_line = (
            f"SELECT 1 FROM {line} w WHERE w.namespace = {locks}.namespace"
            f" AND w.name = {locks}.name AND w.expires_at > ?"
        )
        # (an expired row is kept while its line is alive: the line's invariant)
        #: The sweep of expired rows, ``?`` placeholders unrendered; params (now, now).
        self.sweep_sql = dialect.sweep_expired(
            locks, f"AND ({locks}.waiting = 0 OR NOT EXISTS ({live_line}))"
        )
        self._sweep = q(self.sweep_sql)
        self._now = q(dialect.now_sql) if dialect.now_sql else None
        self._head = q(
            f"SELECT owner FROM {line} WHERE {key} AND expires_at > ? ORDER BY id LIMIT 1"
        )
        self._others = q(
            f"SELECT 1 FROM {line} WHERE {key} AND owner <> ? AND expires_at > ? LIMIT 1"
        )
        self._join = q(
            f"INSERT INTO {line} (namespace, name, owner, expires_at) VALUES (?, {n}, ?, ?)"
        )
        self._stay = q(f"UPDATE {line} SET expires_at = ? WHERE {key} AND owner = ?")
        self._leave = q(f"DELETE FROM {line} WHERE {key} AND owner = ?")
        self._in_line = q(f"SELECT 1 FROM {line} WHERE {key} AND owner = ?")
        self._sweep_line = q(dialect.sweep_expired(line))

    def render(self, sql: str) -> str:
        """``sql`` with its ``?`` placeholders written as the dialect's."""
        placeholder = self.dialect.placeholder
        if placeholder == "$":
            numbers = itertools.count(1)
            return re.sub(r"\?", lambda _: f"${next(numbers)}", sql)
        return sql if placeholder == "?" else sql.replace("?", placeholder)

    def schema(self) -> list[str]:
        """The DDL (idempotent: ``CREATE ... IF NOT EXISTS``)."""
        ddl = [*self.dialect.create_tables(self.locks), *self.dialect.create_line(self.line)]
        return [self.render(s) for s in ddl]

    def now(self) -> Script[int]:
        """Server time in microseconds (without ``now_sql``: the local wall clock)."""
        if self._now is None:
            return time.time_ns() // 1000
        rows = yield Fetch(self._now, ())
        return int(rows[0][0])

    def key(self, name: str) -> Any:
        """The parameter that stands for ``name`` (see :attr:`Dialect.name_sql`)."""
        return self.dialect.name_param(encode_name(name))

    def probe(self, name: str, owner: str) -> Script[Busy | None]:
        """READ: ``Busy`` when a live row of another owner holds ``name``, or another owner
        is first in line; else ``None`` (only ``None`` is worth an :meth:`attempt`)."""
        now = yield from self.now()
        held = yield from self._held_at(name, now)
        if held is not None:
            return Busy(held.expires_in) if held.owner != owner else None
        head = yield Fetch(self._head, (self.namespace, self.key(name), now))
        return Busy() if head and head[0][0] != owner else None

    def attempt(
        self, name: str, owner: str, ttl: float, *, queue: float | None = None
    ) -> Script[Granted | Busy | Behind]:
        """WRITE: one atomic attempt to take ``name`` for ``owner`` for ``ttl`` seconds.

        ``queue``: the owner takes (or keeps) a place in the line of waiters for ``queue``
        seconds (a fair or urgent waiter; it leaves the line when it takes the name);
        ``None``: a plain attempt.  Either way only the first live waiter in line, if there
        is one, may take a free (absent, vacant or expired) row.
        """
        ns, key = self.namespace, self.key(name)
        now = yield from self.now()
        if queue is not None:
            stay = now + micros(queue)
            placed = yield Execute(self._stay, (stay, ns, key, owner))
            if not placed:
                yield Execute(self._join, (ns, key, owner, stay))
        rows = yield Fetch(self._select_for_update, (ns, key))
        waiting = bool(rows and rows[0][4])
        if rows:
            holder, holder_token, holder_expires, version, _ = rows[0]
            if holder != VACANT and holder_expires > now:
                if holder == owner:
                    changed = yield Execute(
                        self._refresh, (now + micros(ttl), ns, key, owner, holder_token, version)
                    )
                    if changed != 1:  # pragma: no cover - the row changed (weaker isolation)
                        return Busy(None)
                    if queue is not None:  # (a holder keeps no place in line)
                        yield Execute(self._leave, (ns, key, owner))
                    return Granted(int(holder_token), refreshed=True)
                if queue is not None and not waiting:
                    yield from self._keep_row(ns, key, now)
                return Busy((holder_expires - now) / 1e6)
        # Free: no row, a vacant one, or an expired one (a new holding gets a new token).
        head = yield Fetch(self._head, (ns, key, now))
        if head and head[0][0] != owner:
            if not waiting:
                yield from self._keep_row(ns, key, now)
            return Behind(str(head[0][0]))
        if rows:
            changed = yield Execute(self._delete_version, (ns, key, rows[0][3]))
            if changed != 1:  # pragma: no cover - another won the take-over
                return Busy(None)
        others = (yield Fetch(self._others, (ns, key, owner, now))) if head else []
        token = yield Insert(self._insert, (ns, key, owner, now + micros(ttl), int(bool(others))))
        if token is None:  # inserted by another meanwhile (no row was locked to wait on)
            if queue is not None:
                yield from self._keep_row(ns, key, now)
            return Busy(None)
        if queue is not None:
            yield Execute(self._leave, (ns, key, owner))
            yield Execute(self._sweep_line, (now,))  # (waiters that died without leaving)
        # Rows of dead holders are taken over by the next attempt on their name; this keeps
        # the table from filling up with names nobody asks for again.
        yield Execute(self._sweep, (now, now))
        return Granted(int(token))

    def _keep_row(self, ns: str, key: Any, now: int) -> Script[None]:
        """The line's invariant: the name's row exists with ``waiting = 1`` (marked, or a
        vacant one inserted, whichever the row's state allows; at most a few rounds)."""
        for _ in range(3):
            marked = yield Execute(self._mark, (ns, key))
            if marked:
                return
            token = yield Insert(self._insert, (ns, key, VACANT, now, 1))
            if token is not None:
                return

    def renew(self, items: Sequence[tuple[str, str, int]], ttl: float) -> Script[list[bool]]:
        """WRITE: extend every live ``(name, owner, token)`` to now + ``ttl``; True per renewal."""
        now = yield from self.now()
        expires_at = now + micros(ttl)
        results: list[bool] = []
        for name, owner, token in items:
            changed = yield Execute(
                self._renew, (expires_at, self.namespace, self.key(name), owner, token, now)
            )
            results.append(changed == 1)
        return results

    def release(self, name: str, owner: str, token: int) -> Script[bool]:
        """WRITE: compare-and-free (vacated for the line, else deleted); True if the row was
        ours AND still live."""
        now = yield from self.now()
        rows = yield Fetch(self._select_for_update, (self.namespace, self.key(name)))
        if not rows or rows[0][0] != owner or rows[0][1] != token:
            return False
        yield from self._free(name, owner, now, rows[0][3])
        return bool(rows[0][2] > now)

    def _free(self, name: str, owner: str, now: int, version: int) -> Script[None]:
        """Free the row read with ``version``: VACATE it while the line has a live waiter
        other than ``owner`` (only the head may take it), else delete it."""
        ns, key = self.namespace, self.key(name)
        others = yield Fetch(self._others, (ns, key, owner, now))
        if others:
            yield Execute(self._vacate, (now, ns, key, version))
        else:
            yield Execute(self._delete_version, (ns, key, version))

    def left_nothing(self, name: str, owner: str) -> Script[bool | None]:
        """READ: ``False`` when ``owner`` has no row for ``name`` (nothing to abandon), else
        ``None``: :meth:`abandon` must run."""
        ns, key = self.namespace, self.key(name)
        rows = yield Fetch(self._select, (ns, key))
        if rows and rows[0][0] == owner:
            return None
        placed = yield Fetch(self._in_line, (ns, key, owner))
        return None if placed else False

    def abandon(self, name: str, owner: str) -> Script[bool]:
        """WRITE: free ``name``'s row if ``owner`` holds it (any token), and leave the line;
        a free row that no live waiter is left for goes too.  True if anything was freed or
        left (the next waiter may go)."""
        ns, key = self.namespace, self.key(name)
        now = yield from self.now()
        left = yield Execute(self._leave, (ns, key, owner))
        rows = yield Fetch(self._select_for_update, (ns, key))
        if not rows:
            return bool(left)
        holder, _token, expires_at, version, _ = rows[0]
        if holder == owner or (left and (holder == VACANT or expires_at <= now)):
            yield from self._free(name, owner, now, version)
            return True
        return bool(left)

    def force_release(self, name: str) -> Script[bool]:
        """WRITE: free ``name``'s row whoever holds it (vacated for a live line, else
        deleted); True if it was a LIVE holder's."""
        now = yield from self.now()
        rows = yield Fetch(self._select_for_update, (self.namespace, self.key(name)))
        if not rows:
            return False
        holder, _token, expires_at, version, _ = rows[0]
        yield from self._free(name, VACANT, now, version)
        return bool(holder != VACANT and expires_at > now)

    def status(self, name: str) -> Script[Held | None]:
        """READ: the live holder of ``name`` or ``None`` (expired or vacant: free)."""
        now = yield from self.now()
        return (yield from self._held_at(name, now))

    def _held_at(self, name: str, now: int) -> Script[Held | None]:
        rows = yield Fetch(self._select, (self.namespace, self.key(name)))
        if not rows:
            return None
        owner, token, expires_at, _version, _waiting = rows[0]
        if owner == VACANT or expires_at <= now:
            return None
        return Held(str(owner), int(token), (expires_at - now) / 1e6)


class _SyncCursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    @property
    def lastrowid(self) -> int | None: ...

    def fetchall(self) -> list[Any]: ...


def _advance(script: Script[T], result: Any) -> tuple[Statement | None, T | None]:
    """The script's next statement, or (None, its value) when it is done."""
    try:
        return script.send(result), None
    except StopIteration as stop:
        return None, stop.value


def run_script(execute: Callable[[str, tuple[Any, ...]], _SyncCursor], script: Script[T]) -> T:
    """Drive ``script`` on a DB-API style ``execute(sql, params) -> cursor`` (blocking; an
    :class:`Insert` must not raise on a duplicate key: ``ON CONFLICT DO NOTHING``)."""
    statement, value = _advance(script, None)
    while statement is not None:
        cursor = execute(statement.sql, statement.params)
        fetched: Any
        if isinstance(statement, Fetch):
            fetched = cursor.fetchall()
        elif isinstance(statement, Insert):
            fetched = cursor.lastrowid if cursor.rowcount == 1 else None
        else:
            fetched = cursor.rowcount
        statement, value = _advance(script, fetched)
    return value  # type: ignore[return-value]


async def run_script_async(
    execute: Callable[[str, tuple[Any, ...]], Awaitable[tuple[int, list[Any]]]],
    script: Script[T],
    insert: Callable[[str, tuple[Any, ...]], Awaitable[int | None]] | None = None,
) -> T:
    """Drive ``script`` on an async ``execute(sql, params) -> (rowcount, rows)``; an
    :class:`Insert` runs on ``insert(sql, params) -> token | None`` if given, else on
    ``execute``, its SQL returning the token (``RETURNING token``)."""
    statement, value = _advance(script, None)
    while statement is not None:
        result: Any
        if isinstance(statement, Insert) and insert is not None:
            result = await insert(statement.sql, statement.params)
        else:
            rowcount, rows = await execute(statement.sql, statement.params)
            if isinstance(statement, Insert):
                result = int(rows[0][0]) if rows else None
            else:
                result = rows if isinstance(statement, Fetch) else rowcount
        statement, value = _advance(script, result)
    return value  # type: ignore[return-value]
