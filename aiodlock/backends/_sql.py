"""The lock-table design shared by the SQL backends (SQLite and MySQL/MariaDB).

``aiodlock_locks`` holds one row per HELD name under the unique key (namespace, name):
the name as UTF-8 bytes (compared byte for byte), the owner, the fencing token, the expiry
(server time in microseconds) and a version bumped by every write (optimistic take-over).
``aiodlock_counters`` holds the last token per name ever locked, never deleted or reset.

Every operation is a *script* (a generator of :class:`Fetch` / :class:`Execute` statements
that returns the outcome), run on ``sqlite3`` in a worker thread (:func:`run_script`) or on an
async driver (:func:`run_script_async`).  *Write* scripts run in one transaction that
serialises writers of the row (SQLite ``BEGIN IMMEDIATE``; InnoDB ``FOR UPDATE``), *read*
scripts outside any.  A dialect that sends several statements at once also gets the
one-round-trip fast path of :mod:`aiodlock.backends._sql_fast` (a :class:`Batch` brings its
own transaction).
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
    "Batch",
    "Behind",
    "Dialect",
    "Execute",
    "Fetch",
    "Granted",
    "Held",
    "LockTable",
    "Script",
    "encode_name",
    "micros",
    "run_script",
    "run_script_async",
]

T = TypeVar("T")


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
class Batch:
    """Several statements (``;``-separated) sent in ONE round trip, where the dialect can
    (:attr:`Dialect.batches`); the script receives ``[(rowcount, rows), ...]``, one per
    statement.  ``retry_safe``: running it twice is harmless (a lost reply may be retried on
    another connection even if the server ran it)."""

    sql: str
    params: tuple[Any, ...]
    retry_safe: bool = False


Statement = Fetch | Execute | Batch
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
    #: read it inline; ``None``: the dialect has none (the local clock is used).
    now_expr: str | None = None
    #: Several statements can go in one round trip (:class:`Batch`): the table's fast path
    #: (:mod:`aiodlock.backends._sql_fast`) is available.
    batches: bool = False
    #: The statement that opens a write transaction inside a :class:`Batch`.
    begin_sql: str = "BEGIN"
    #: How many expired rows one grant deletes at most (keeps every write short).
    sweep_limit: int = 64
    #: The SQL expression a name's parameter stands in (e.g. ``"UNHEX(?)"``).
    name_sql: str = "?"
    #: Appended to the INSERT of a lock row (e.g. ``" ON CONFLICT DO NOTHING"``, where a
    #: duplicate key would abort the transaction: the script sees 0 rows inserted instead).
    insert_suffix: str = ""

    def name_param(self, key: bytes) -> Any:
        """The parameter sent for a name's stored bytes (``name_sql`` turns it back)."""
        return key

    def create_tables(self, locks: str, counters: str) -> list[str]:
        """Idempotent DDL for both tables and the expiry index."""
        raise NotImplementedError

    def bump_counter(self, counters: str) -> str:
        """Insert ``(namespace, name, 1)`` or add 1 to the row's token; params (ns, name)
        (the name's placeholder written as :attr:`name_sql`)."""
        raise NotImplementedError

    def insert_select(self, table: str, columns: str, select: str, on_duplicate: str) -> str:
        """``INSERT INTO table (columns) select`` that, on a duplicate key, applies the
        assignments ``on_duplicate`` (columns written ``table.column``) to the row there
        (only a dialect with :attr:`batches` needs it)."""
        raise NotImplementedError

    def bump_if_inserted(self, counters: str) -> tuple[str, str]:
        """For a :class:`Batch`: a statement that adds 1 to the counter of ``(namespace,
        name)`` (params (ns, name); a missing row starts at 1) only if the statement just
        before it inserted a row, and an expression that reads the new value later in the
        same batch (only a dialect with :attr:`batches` needs it)."""
        raise NotImplementedError

    def sweep_expired(self, locks: str) -> str:
        """Delete at most :attr:`sweep_limit` rows with ``expires_at < ?``; params (now,)."""
        raise NotImplementedError

    def create_line(self, line: str) -> list[str]:
        """Idempotent DDL of the line of waiters: ``id`` (increasing with every insert),
        namespace, name, owner, expires_at; unique (namespace, name, owner)."""
        raise NotImplementedError


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class LockTable:
    """The lock-table algorithm for one namespace, as driver-agnostic scripts.

    Invariants the scripts keep (the unique key does the rest):

    * a token is taken from the name's counter row in the SAME transaction as the grant,
      so a grant and its token commit or vanish together, and the counter (never reset,
      never deleted) makes tokens strictly increase across processes and restarts;
    * an EXPIRED row is taken over with ``UPDATE ... WHERE version = ?``: if anybody
      wrote the row since we read it, nothing changes and the attempt reports busy;
    * an attempt by the row's own owner on a live row is idempotent: same token, new
      expiry (a retried attempt whose reply was lost must not count twice);
    * an expired row counts as free everywhere: it is never renewed, it is not reported
      by :meth:`status`, and releasing it reports ``False``.
    """

    def __init__(
        self,
        dialect: Dialect,
        namespace: str,
        *,
        locks: str = "aiodlock_locks",
        counters: str = "aiodlock_counters",
        line: str = "aiodlock_waiters",
    ) -> None:
        for table in (locks, counters, line):
            if not _IDENT.match(table):
                raise ValueError(f"bad SQL table name {table!r}")
        self.dialect = dialect
        self.namespace = namespace
        self.locks = locks
        self.counters = counters
        self.line = line
        q = self.render
        cols = "owner, token, expires_at, version"
        n = dialect.name_sql
        key = f"namespace = ? AND name = {n}"
        self._select = q(f"SELECT {cols} FROM {locks} WHERE {key}")
        self._select_for_update = q(f"SELECT {cols} FROM {locks} WHERE {key}{dialect.for_update}")
        self._insert = q(
            f"INSERT INTO {locks} (namespace, name, owner, token, expires_at, version) "
            f"VALUES (?, {n}, ?, ?, ?, 1){dialect.insert_suffix}"
        )
        self._take_over = q(
            f"UPDATE {locks} SET owner = ?, token = ?, expires_at = ?, version = version + 1 "
            f"WHERE {key} AND version = ?"
        )
        self._refresh = q(
            f"UPDATE {locks} SET expires_at = ?, version = version + 1 "
            f"WHERE {key} AND owner = ? AND token = ? AND version = ?"
        )
        self._renew = q(
            f"UPDATE {locks} SET expires_at = ?, version = version + 1 "
            f"WHERE {key} AND owner = ? AND token = ? AND expires_at > ?"
        )
        self._delete_held = q(f"DELETE FROM {locks} WHERE {key} AND owner = ? AND token = ?")
        self._delete_owner = q(f"DELETE FROM {locks} WHERE {key} AND owner = ?")
        self._delete_live = q(f"DELETE FROM {locks} WHERE {key} AND expires_at > ?")
        self._delete_any = q(f"DELETE FROM {locks} WHERE {key}")
        self._bump = q(dialect.bump_counter(counters))
        self._read_counter = q(f"SELECT token FROM {counters} WHERE {key}")
        self._sweep = q(dialect.sweep_expired(locks))
        self._now = q(dialect.now_sql) if dialect.now_sql else None
        self._head = q(
            f"SELECT owner FROM {line} WHERE {key} AND expires_at > ? ORDER BY id LIMIT 1"
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
        ddl = [*self.dialect.create_tables(self.locks, self.counters)]
        ddl += self.dialect.create_line(self.line)
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

    def _next_token(self, key: Any) -> Script[int]:
        yield Execute(self._bump, (self.namespace, key))
        rows = yield Fetch(self._read_counter, (self.namespace, key))
        return int(rows[0][0])

    def probe(self, name: str, owner: str) -> Script[Busy | None]:
        """READ: ``Busy`` when a live row of another owner holds ``name``, else ``None`` (a
        poll that costs no write lock; only ``None`` is worth an :meth:`attempt`)."""
        now = yield from self.now()
        held = yield from self._held_at(name, now)
        if held is not None:
            return Busy(held.expires_in) if held.owner != owner else None
        # Nobody barges past the line: a free name with waiters in line is theirs.
        head = yield Fetch(self._head, (self.namespace, self.key(name), now))
        return Busy() if head and head[0][0] != owner else None

    def attempt(
        self, name: str, owner: str, ttl: float, *, queue: float | None = None
    ) -> Script[Granted | Busy | Behind]:
        """WRITE: one atomic attempt to take ``name`` for ``owner`` for ``ttl`` seconds.

        ``queue``: the owner takes (or keeps) a place in the line of waiters for ``queue``
        seconds (a fair or urgent waiter; only the first live one in line may take a free
        name, and it leaves the line when it does); ``None``: a plain attempt (the
        :meth:`probe` before it keeps it from barging past the line).
        """
        ns, key = self.namespace, self.key(name)
        now = yield from self.now()
        expires_at = now + micros(ttl)
        if queue is not None:
            stay = now + micros(queue)
            placed = yield Execute(self._stay, (stay, ns, key, owner))
            if not placed:
                yield Execute(self._join, (ns, key, owner, stay))
        rows = yield Fetch(self._select_for_update, (ns, key))
        if rows:
            holder, holder_token, holder_expires, version = rows[0]
            if holder_expires > now:
                if holder != owner:
                    return Busy((holder_expires - now) / 1e6)
                changed = yield Execute(
                    self._refresh, (expires_at, ns, key, owner, holder_token, version)
                )
                if changed != 1:  # pragma: no cover - the row changed under a weaker isolation
                    return Busy(None)
                return Granted(int(holder_token), refreshed=True)
        # Free, or expired (even if it was ours: a new holding after a gap gets a new token).
        if queue is not None:
            head = yield Fetch(self._head, (ns, key, now))
            if head and head[0][0] != owner:
                return Behind(str(head[0][0]))
        token = yield from self._next_token(key)
        if rows:
            changed = yield Execute(self._take_over, (owner, token, expires_at, ns, key, version))
        else:
            changed = yield Execute(self._insert, (ns, key, owner, token, expires_at))
        if changed != 1:  # pragma: no cover - another won the take-over (or INSERT IGNORE)
            return Busy(None)
        if queue is not None:
            yield Execute(self._leave, (ns, key, owner))
            yield Execute(self._sweep_line, (now,))  # (waiters that died without leaving)
        # Rows of dead holders are taken over by the next attempt on their name; this keeps
        # the table from filling up with names nobody asks for again.
        yield Execute(self._sweep, (now,))
        return Granted(token)

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
        """WRITE: compare-and-delete; True if the row was ours AND still live."""
        ns, key = self.namespace, self.key(name)
        now = yield from self.now()
        rows = yield Fetch(self._select_for_update, (ns, key))
        if not rows:
            return False
        holder, holder_token, holder_expires, _version = rows[0]
        if holder != owner or holder_token != token:
            return False
        yield Execute(self._delete_held, (ns, key, owner, token))
        return bool(holder_expires > now)

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
        """WRITE: delete ``name``'s row if ``owner`` holds it (any token), and its place in
        line; True if the row or the place was deleted (the next waiter may go)."""
        ns, key = self.namespace, self.key(name)
        deleted = yield Execute(self._delete_owner, (ns, key, owner))
        left = yield Execute(self._leave, (ns, key, owner))
        return bool(deleted or left)

    def force_release(self, name: str) -> Script[bool]:
        """WRITE: delete ``name``'s row whoever holds it; True if a LIVE row was deleted."""
        ns, key = self.namespace, self.key(name)
        now = yield from self.now()
        live = yield Execute(self._delete_live, (ns, key, now))
        yield Execute(self._delete_any, (ns, key))
        return bool(live)

    def status(self, name: str) -> Script[Held | None]:
        """READ: the live holder of ``name`` or ``None`` (an expired row counts as free)."""
        now = yield from self.now()
        return (yield from self._held_at(name, now))

    def _held_at(self, name: str, now: int) -> Script[Held | None]:
        rows = yield Fetch(self._select, (self.namespace, self.key(name)))
        if not rows:
            return None
        owner, token, expires_at, _version = rows[0]
        if expires_at <= now:
            return None
        return Held(str(owner), int(token), (expires_at - now) / 1e6)


class _SyncCursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...


def _advance(script: Script[T], result: Any) -> tuple[Statement | None, T | None]:
    """The script's next statement, or (None, its value) when it is done."""
    try:
        return script.send(result), None
    except StopIteration as stop:
        return None, stop.value


def run_script(execute: Callable[[str, tuple[Any, ...]], _SyncCursor], script: Script[T]) -> T:
    """Drive ``script`` on a DB-API style ``execute(sql, params) -> cursor`` (blocking)."""
    statement, value = _advance(script, None)
    while statement is not None:
        if isinstance(statement, Batch):
            raise TypeError("this driver cannot run a Batch")
        cursor = execute(statement.sql, statement.params)
        fetched = cursor.fetchall() if isinstance(statement, Fetch) else cursor.rowcount
        statement, value = _advance(script, fetched)
    return value  # type: ignore[return-value]


async def run_script_async(
    execute: Callable[[str, tuple[Any, ...]], Awaitable[tuple[int, list[Any]]]],
    script: Script[T],
    batch: Callable[[Batch], Awaitable[list[tuple[int, list[Any]]]]] | None = None,
) -> T:
    """Drive ``script`` on an async ``execute(sql, params) -> (rowcount, rows)`` (and, for
    a :class:`Batch`, ``batch(statement) -> [(rowcount, rows), ...]``)."""
    statement, value = _advance(script, None)
    while statement is not None:
        result: Any
        if isinstance(statement, Batch):
            if batch is None:
                raise TypeError("this driver cannot run a Batch")
            result = await batch(statement)
        else:
            rowcount, rows = await execute(statement.sql, statement.params)
            result = rows if isinstance(statement, Fetch) else rowcount
        statement, value = _advance(script, result)
    return value  # type: ignore[return-value]
