"""The lock table's fast path: an uncontended cycle is ONE plain INSERT and ONE DELETE.

For a dialect that reads the server clock inline (:attr:`Dialect.now_expr`), each is its
own transaction (autocommit), with only cheap conditions, and no read before it:

* the grab INSERTs the row (``waiting = 0``); its token is the new row's auto-increment
  id (the driver reports it, or ``RETURNING token``).  A duplicate key (the name has a row:
  held, expired, vacant, or kept for a line of waiters: see :class:`LockTable`) changes
  nothing and leaves the decision to the table's scripts;
* the drop DELETEs the row only if it is the owner's, with its token, still live, and
  nobody marked it ``waiting``; else (0 rows) the table's release script decides (it
  vacates the row for the first in line, or reports an expired row).

Running a grab twice is harmless: the second finds the owner's own live row, which the
table refreshes with the same token.
"""

from __future__ import annotations

from typing import Any

from .._types import monotonic
from ._sql import Execute, Granted, Insert, LockTable, Script, micros

__all__ = ["FastPath"]


class FastPath:
    """One-statement attempt and release on ``table`` (its dialect must have ``now_expr``)."""

    #: At most once in this many seconds, a grant also deletes up to ``sweep_limit`` expired
    #: rows (the rows of holders that died, on names nobody asks for again).  By time, not by
    #: count: under a stream of grants, the expiry index holds the entries of rows deleted
    #: moments ago until InnoDB purges them, and a sweep walks them all (measured: a sweep
    #: every 16 grants cost a fifth of an uncontended cycle's time).
    sweep_every = 1.0

    def __init__(self, table: LockTable) -> None:
        dialect = table.dialect
        now = dialect.now_expr
        if now is None:
            raise ValueError(f"the {dialect.name} dialect has no clock expression")
        self.table = table
        n, locks = dialect.name_sql, table.locks
        key = f"namespace = ? AND name = {n}"
        #: The grab's INSERT (params: :meth:`grab_params`; the driver reports the new id).
        self.grab_sql = table.render(
            f"INSERT INTO {locks} (namespace, name, owner, expires_at, version, waiting) "
            f"VALUES (?, {n}, ?, {now} + ?, 1, 0){dialect.insert_suffix}"
        )
        #: The drop's DELETE (params: :meth:`drop_params`; 1 row changed: released).
        self.drop_sql = table.render(
            f"DELETE FROM {locks} WHERE {key} AND owner = ? AND token = ? AND waiting = 0"
            f" AND expires_at > {now}"
        )
        #: The sweep's DELETE (no params; the server's clock).
        self.sweep_sql = table.render(table.sweep_sql.replace("?", now))
        self._sweep_at = 0.0  # (the first grant sweeps)

    def grab_params(self, name: str, owner: str, ttl: float) -> tuple[Any, ...]:
        table = self.table
        return (table.namespace, table.key(name), owner, micros(ttl))

    def drop_params(self, name: str, owner: str, token: int) -> tuple[Any, ...]:
        table = self.table
        return (table.namespace, table.key(name), owner, token)

    def sweep_due(self) -> bool:
        """Is a sweep due with this grant (then the next one is due in ``sweep_every``)?"""
        now = monotonic()
        if now < self._sweep_at:
            return False
        self._sweep_at = now + self.sweep_every
        return True

    def grab(self, name: str, owner: str, ttl: float) -> Script[Granted | None]:
        """WRITE, one statement: take a free ``name`` (nobody has a row for it); ``None``:
        the table's :meth:`~LockTable.probe` and :meth:`~LockTable.attempt` decide."""
        token = yield Insert(self.grab_sql, self.grab_params(name, owner, ttl))
        if token is None:
            return None
        if self.sweep_due():
            yield Execute(self.sweep_sql, ())
        return Granted(int(token))

    def drop(self, name: str, owner: str, token: int) -> Script[bool | None]:
        """WRITE, one statement: delete ``name``'s live row if it is ``owner``'s with
        ``token`` and nobody waits; ``None``: the table's :meth:`~LockTable.release` decides."""
        changed = yield Execute(self.drop_sql, self.drop_params(name, owner, token))
        return True if changed == 1 else None
