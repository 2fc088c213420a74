"""The lock table of ``strategy="table"`` (:class:`AnnouncingTable`): the shared scripts of
:mod:`aiodlock.backends._sql` in the PostgreSQL dialect, whose releases NOTIFY the waiter
that may take the name now, and one-statement fast paths (one round trip each, one
transaction each): the take of a FREE name with nobody in line, the attempt of a waiter
already in line, and the release."""

from __future__ import annotations

from ..._types import Busy
from .._sql import Behind, Fetch, Granted, LockTable, Script, micros
from . import _statements as sql
from ._dialect import POSTGRES

__all__ = ["AnnouncingTable", "call_next"]

#: The server's clock in microseconds (the dialect's ``now_sql``, as an expression).
NOW = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"


def call_next(listeners: str, line: str) -> str:
    """$1 key, $2 channel, $3 namespace, $4 name: NOTIFY (at commit) the client whose waiter
    may take the name now.  With a line of waiters (fair or urgent ones), every client
    listening for the name is told the owner first in line (``"key owner"``) and only the
    one where that owner waits wakes it; without one, the client that has waited longest
    alone is told the key (as :func:`._statements.call_next`), and wakes one of its waiters."""
    return (
        f"WITH head AS (SELECT owner FROM {line} WHERE namespace = $3 AND name = $4"
        f" AND expires_at > {NOW} ORDER BY id LIMIT 1) "
        "SELECT pg_notify($2::text || '_' || w.pid::text,"
        " $1::bigint::text || coalesce(' ' || (SELECT owner FROM head), '')) FROM"
        f" (SELECT pid FROM {listeners} WHERE key = $1::bigint AND NOT {sql.DEAD_PID}"
        " ORDER BY since LIMIT CASE WHEN EXISTS (SELECT 1 FROM head) THEN NULL ELSE 1 END) w"
    )


def take_free(locks: str, counters: str, line: str) -> str:
    """$1 namespace, $2 name, $3 owner, $4 lease (µs) -> (token, held): ``token`` when the
    name was FREE (no row at all) with nobody in line, and is now the owner's (the counter
    bumped in the same statement); else ``held``, the µs left to another owner's live row,
    or two NULLs: the full script decides (an expired row, a line, the owner's own row, or
    a row inserted meanwhile by another: then the token taken is a gap, never a repeat)."""
    return (
        f"WITH n AS (SELECT {NOW} AS t),"
        f" held AS (SELECT owner, expires_at FROM {locks} WHERE namespace = $1 AND name = $2),"
        " free AS (SELECT n.t FROM n WHERE NOT EXISTS (SELECT 1 FROM held) AND NOT EXISTS"
        f" (SELECT 1 FROM {line} WHERE namespace = $1 AND name = $2 AND expires_at > n.t)),"
        f" bump AS (INSERT INTO {counters} AS c (namespace, name, token)"
        " SELECT $1, $2, 1 FROM free"
        " ON CONFLICT (namespace, name) DO UPDATE SET token = c.token + 1 RETURNING token),"
        f" got AS (INSERT INTO {locks} (namespace, name, owner, token, expires_at, version)"
        " SELECT $1, $2, $3, bump.token, free.t + $4::bigint, 1 FROM bump, free"
        " ON CONFLICT DO NOTHING RETURNING token) "
        "SELECT (SELECT token FROM got),"
        " (SELECT held.expires_at - n.t FROM held, n"
        " WHERE held.owner <> $3 AND held.expires_at > n.t)"
    )


def take_in_line(locks: str, counters: str, line: str) -> str:
    """$1 namespace, $2 name, $3 owner, $4 lease (µs), $5 stay (µs) -> (placed, token, held,
    head) for an owner that already has a place in the line of waiters: ``token`` when the
    name was FREE (no row at all) and the owner first in line (it leaves the line);
    else its place is kept ``stay`` longer, ``held`` is the µs left to another owner's live
    row and ``head`` the owner first in line.  ``placed`` false (no place yet), or nothing
    of that: the full script decides.  (The line row is deleted OR updated, never both: a
    statement must not modify one row twice; both run whether read or not.)"""
    return (
        f"WITH n AS (SELECT {NOW} AS t),"
        f" placed AS (SELECT 1 FROM {line} WHERE namespace = $1 AND name = $2 AND owner = $3),"
        f" held AS (SELECT owner, expires_at FROM {locks} WHERE namespace = $1 AND name = $2),"
        f" head AS (SELECT owner FROM {line}, n WHERE namespace = $1 AND name = $2"
        " AND expires_at > n.t ORDER BY id LIMIT 1),"
        " free AS (SELECT n.t FROM n WHERE EXISTS (SELECT 1 FROM placed)"
        " AND NOT EXISTS (SELECT 1 FROM held) AND (SELECT owner FROM head) = $3),"
        f" bump AS (INSERT INTO {counters} AS c (namespace, name, token)"
        " SELECT $1, $2, 1 FROM free"
        " ON CONFLICT (namespace, name) DO UPDATE SET token = c.token + 1 RETURNING token),"
        f" got AS (INSERT INTO {locks} (namespace, name, owner, token, expires_at, version)"
        " SELECT $1, $2, $3, bump.token, free.t + $4::bigint, 1 FROM bump, free"
        " ON CONFLICT DO NOTHING RETURNING token),"
        f" gone AS (DELETE FROM {line} WHERE namespace = $1 AND name = $2 AND owner = $3"
        " AND EXISTS (SELECT 1 FROM got)),"
        f" stay AS (UPDATE {line} SET expires_at = n.t + $5::bigint FROM n"
        " WHERE namespace = $1 AND name = $2 AND owner = $3"
        " AND NOT EXISTS (SELECT 1 FROM got)) "
        "SELECT EXISTS (SELECT 1 FROM placed), (SELECT token FROM got),"
        " (SELECT held.expires_at - n.t FROM held, n"
        " WHERE held.owner <> $3 AND held.expires_at > n.t),"
        " (SELECT owner FROM head)"
    )


def release(locks: str, listeners: str, line: str) -> str:
    """$1 key, $2 channel, $3 namespace, $4 name, $5 owner, $6 token -> (released, called):
    compare-and-delete (``released``: the row was ours AND live) and :func:`call_next`."""
    return (
        f"WITH gone AS (DELETE FROM {locks} WHERE namespace = $3 AND name = $4"
        " AND owner = $5 AND token = $6 RETURNING expires_at),"
        f" called AS ({call_next(listeners, line)}) "
        f"SELECT coalesce((SELECT expires_at > {NOW} FROM gone), false),"
        " (SELECT count(*) FROM called)"
    )


class AnnouncingTable(LockTable):
    """The lock table whose releases (and abandons and breaks that freed something) call the
    client whose waiter may take the name now, in the same transaction (a NOTIFY is sent
    when, and only if, it commits)."""

    def __init__(self, namespace: str, listeners: str, channel: str) -> None:
        super().__init__(POSTGRES, namespace)
        self._channel = channel
        self._call_next = call_next(listeners, self.line)
        self._take_free = take_free(self.locks, self.counters, self.line)
        self._take_in_line = take_in_line(self.locks, self.counters, self.line)
        self._release_now = release(self.locks, listeners, self.line)

    def _call(self, name: str) -> tuple[object, ...]:
        key = sql.lock_key(self.namespace, name)
        return (key, self._channel, self.namespace, self.key(name))

    def _announce(self, name: str) -> Script[None]:
        yield Fetch(self._call_next, self._call(name))

    def take_free(self, name: str, owner: str, ttl: float) -> Script[Granted | Busy | None]:
        """ONE statement: :class:`Granted` (a free name), :class:`Busy` (another's live row),
        or None: the full :meth:`attempt` decides."""
        rows = yield Fetch(self._take_free, (self.namespace, self.key(name), owner, micros(ttl)))
        token, held = rows[0]
        if token is not None:
            return Granted(int(token))
        return None if held is None else Busy(held / 1e6)

    def take_in_line(
        self, name: str, owner: str, ttl: float, queue: float
    ) -> Script[Granted | Busy | Behind | None]:
        """ONE statement, for an owner with a place in line (kept ``queue`` seconds longer):
        :class:`Granted`, :class:`Busy`, :class:`Behind`, or None: the full :meth:`attempt`
        decides (no place yet, an expired row, the owner's own row, a race lost)."""
        params = (self.namespace, self.key(name), owner, micros(ttl), micros(queue))
        rows = yield Fetch(self._take_in_line, params)
        placed, token, held, head = rows[0]
        if not placed:
            return None
        if token is not None:
            return Granted(int(token))
        if held is not None:
            return Busy(held / 1e6)
        if head is not None and head != owner:
            return Behind(str(head))
        return None

    def release(self, name: str, owner: str, token: int) -> Script[bool]:
        """ONE statement: compare-and-delete, and call the next waiter (even if the row had
        expired: the name is free)."""
        rows = yield Fetch(self._release_now, (*self._call(name), owner, token))
        return bool(rows[0][0])

    def abandon(self, name: str, owner: str) -> Script[bool]:
        freed = yield from super().abandon(name, owner)
        if freed:  # (a row, or a place in line that may have kept the next one waiting)
            yield from self._announce(name)
        return freed

    def force_release(self, name: str) -> Script[bool]:
        released = yield from super().force_release(name)
        yield from self._announce(name)
        return released
