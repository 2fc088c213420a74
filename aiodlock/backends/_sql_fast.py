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

from ._sql import Execute, Granted, Insert, LockTable, Script, micros

__all__ = ["FastPath"]


class FastPath:
    """One-statement attempt and release on ``table`` (its dialect must have ``now_expr``)."""

    #: Every this many grants, one also deletes up to ``sweep_limit`` expired rows (the rows
    #: of holders that died, on names nobody asks for again).
    sweep_every = 16

    def __init__(self, table: LockTable) -> None:
        dialect = table.dialect
        now = dialect.now_expr
        if now is None:
            raise ValueError(f"the {dialect.name} dialect has no clock expression")
        self.table = table
        n, locks = dialect.name_sql, table.locks
        key = f"namespace = ? AND name = {n}"
        self._grab = table.render(
            f"INSERT INTO {locks} (namespace, name, owner, expires_at, version, waiting) "
            f"VALUES (?, {n}, ?, {now} + ?, 1, 0){dialect.insert_suffix}"
        )
        self._drop = table.render(
            f"DELETE FROM {locks} WHERE {key} AND owner = ? AND token = ? AND waiting = 0"
            f" AND expires_at > {now}"
        )
        self._sweep = table.render(table.sweep_sql.replace("?", now))  # (the server's now)
        self._grabs = 0

    def grab(self, name: str, owner: str, ttl: float) -> Script[Granted | None]:
        """WRITE, one statement: take a free ``name`` (nobody has a row for it); ``None``:
        the table's :meth:`~LockTable.probe` and :meth:`~LockTable.attempt` decide."""
        table = self.table
        token = yield Insert(self._grab, (table.namespace, table.key(name), owner, micros(ttl)))
        if token is None:
            return None
        self._grabs += 1
        if self._grabs % self.sweep_every == 0:
            yield Execute(self._sweep, ())
        return Granted(int(token))

    def drop(self, name: str, owner: str, token: int) -> Script[bool | None]:
        """WRITE, one statement: delete ``name``'s live row if it is ``owner``'s with
        ``token`` and nobody waits; ``None``: the table's :meth:`~LockTable.release` decides."""
        table = self.table
        changed = yield Execute(self._drop, (table.namespace, table.key(name), owner, token))
        return True if changed == 1 else None
