"""The lock table of ``strategy="table"`` (:class:`AnnouncingTable`): the shared scripts of
:mod:`aiodlock.backends._sql` in the PostgreSQL dialect, whose releases NOTIFY the waiter
that may take the name now, and the shared fast path (:class:`AnnouncingFastPath`: one
INSERT to take a free name, one DELETE to release it, which NOTIFYs too)."""

from __future__ import annotations

from .._sql import Fetch, LockTable, Script
from .._sql_fast import FastPath
from . import _statements as sql
from ._dialect import POSTGRES

__all__ = ["AnnouncingFastPath", "AnnouncingTable", "call_next"]

#: The server's clock in microseconds (the dialect's ``now_expr``).
NOW = POSTGRES.now_expr


def call_next(listeners: str, line: str, when: str = "") -> str:
    """$1 key, $2 channel, $3 namespace, $4 name: NOTIFY (at commit) the client whose waiter
    may take the name now.  With a line of waiters (fair or urgent ones), the client of the
    owner first in line is told that owner (``"key owner"``), and wakes its waiter (a row
    that names no client, a client of an earlier aiodlock's, is told too: it may be that
    one); without one, the client that has waited longest alone is told the key (as
    :func:`._statements.call_next`), and wakes one of its waiters.  ``when``: an extra
    condition (``AND ...``): nobody is called unless it holds."""
    first = f"(SELECT {sql.client_of('owner')} FROM head)"
    return (
        f"WITH head AS (SELECT owner FROM {line} WHERE namespace = $3 AND name = $4"
        f" AND expires_at > {NOW} ORDER BY id LIMIT 1) "
        "SELECT pg_notify($2::text || '_' || w.pid::text,"
        " $1::bigint::text || coalesce(' ' || (SELECT owner FROM head), '')) FROM"
        f" (SELECT pid FROM {listeners} WHERE key = $1::bigint AND NOT {sql.DEAD_PID} {when}"
        f" AND (client IS NULL OR NOT EXISTS (SELECT 1 FROM head) OR client = {first})"
        " ORDER BY since LIMIT CASE WHEN EXISTS (SELECT 1 FROM head) THEN NULL ELSE 1 END) w"
    )


def release(locks: str, listeners: str, line: str) -> str:
    """$1 key, $2 channel, $3 namespace, $4 name, $5 owner, $6 token -> (released,): the
    fast path's compare-and-delete of a live row nobody waits for (``released``), and, if
    it deleted it, :func:`call_next` (else the release script calls)."""
    return (
        f"WITH gone AS (DELETE FROM {locks} WHERE namespace = $3 AND name = $4"
        f" AND owner = $5 AND token = $6 AND waiting = 0 AND expires_at > {NOW}"
        " RETURNING 1),"
        f" called AS ({call_next(listeners, line, 'AND EXISTS (SELECT 1 FROM gone)')}) "
        "SELECT EXISTS (SELECT 1 FROM gone), (SELECT count(*) FROM called)"
    )


class AnnouncingTable(LockTable):
    """The lock table whose releases (and abandons and breaks that freed something) call the
    client whose waiter may take the name now, in the same transaction (a NOTIFY is sent
    when, and only if, it commits)."""

    def __init__(self, namespace: str, listeners: str, channel: str) -> None:
        super().__init__(POSTGRES, namespace)
        self.channel = channel
        self._call_next = call_next(listeners, self.line)

    def call(self, name: str) -> tuple[object, ...]:
        """The parameters of :func:`call_next` for ``name``."""
        key = sql.lock_key(self.namespace, name)
        return (key, self.channel, self.namespace, self.key(name))

    def announce(self, name: str) -> Script[None]:
        """NOTIFY the client whose waiter may take ``name`` now (see :func:`call_next`)."""
        yield Fetch(self._call_next, self.call(name))

    def release(self, name: str, owner: str, token: int) -> Script[bool]:
        released = yield from super().release(name, owner, token)
        yield from self.announce(name)  # (even if the row had expired: the name is free)
        return released

    def abandon(self, name: str, owner: str) -> Script[bool]:
        freed = yield from super().abandon(name, owner)
        if freed:  # (a row, or a place in line that may have kept the next one waiting)
            yield from self.announce(name)
        return freed

    def force_release(self, name: str) -> Script[bool]:
        released = yield from super().force_release(name)
        yield from self.announce(name)
        return released


class AnnouncingFastPath(FastPath):
    """The shared fast path, whose release NOTIFYs in the same statement."""

    def __init__(self, table: AnnouncingTable, listeners: str) -> None:
        super().__init__(table)
        self._announcing = table
        self._release = release(table.locks, listeners, table.line)

    def drop(self, name: str, owner: str, token: int) -> Script[bool | None]:
        rows = yield Fetch(self._release, (*self._announcing.call(name), owner, token))
        return True if rows[0][0] else None
