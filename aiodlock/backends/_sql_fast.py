"""The lock table's fast path: an attempt and a release in ONE round trip each.

For a dialect that sends several statements at once (:attr:`Dialect.batches`: MySQL's
multi-statement queries), the common case of :meth:`LockTable.attempt` (a FREE name) and
:meth:`LockTable.release` are written as one :class:`Batch` each, with the server's clock
read inline (:attr:`Dialect.now_expr`).  Everything else (an expired row to take over, the
owner's own live row, a place in the line of waiters) stays with the scripts of
:class:`LockTable`, which :meth:`FastPath.grab` hands over to by returning ``None``.

The grab keeps the table's invariants:

* the row is inserted with token 0 only if the name has no row and no live waiter of
  another owner is in line (nobody barges past the line); on a duplicate key nothing
  changes (an expired row is taken over only by the table's ``UPDATE ... WHERE version``);
* in the SAME transaction, and only if that INSERT inserted the row, the name's counter is
  bumped (:meth:`Dialect.bump_if_inserted`), and its new value becomes the token of the
  row that is ours with token 0 (so: the row we just inserted): a grant and its token
  commit or vanish together, and a connection lost before COMMIT leaves nothing;
* the row read back tells the outcome: ours with a new token (granted), another owner's
  live row (busy, with its remaining time), no row (a line of others: busy), or
  anything else (our own live row, an expired row): the table's scripts decide.

Running a grab twice is harmless: the second finds the owner's own live row, which the
table refreshes with the same token.
"""

from __future__ import annotations

from typing import Any

from .._types import Busy
from ._sql import Batch, Granted, LockTable, Script, micros

__all__ = ["FastPath"]


class FastPath:
    """One-round-trip attempt and release on ``table`` (its dialect must have batches)."""

    #: Every this many grabs, one also deletes up to ``sweep_limit`` expired rows (the rows
    #: of holders that died, on names nobody asks for again).
    sweep_every = 16

    def __init__(self, table: LockTable) -> None:
        dialect = table.dialect
        if not dialect.batches or dialect.now_expr is None:
            raise ValueError(f"the {dialect.name} dialect cannot send batches")
        self.table = table
        now, n = dialect.now_expr, dialect.name_sql
        locks, counters, line = table.locks, table.counters, table.line
        key = f"namespace = ? AND name = {n}"
        insert = dialect.insert_select(
            locks,
            "namespace, name, owner, token, expires_at, version",
            f"SELECT ?, {n}, ?, 0, {now} + ?, 1 FROM DUAL WHERE NOT EXISTS ("
            f"SELECT 1 FROM {line} WHERE {key} AND expires_at > {now} AND owner <> ?)",
            f"{locks}.version = {locks}.version",
        )
        bump, bumped = dialect.bump_if_inserted(counters)
        grab = [
            dialect.begin_sql,
            insert,
            bump,  # params (ns, name): only if the INSERT just before inserted a row
            f"UPDATE {locks} SET token = {bumped} WHERE {key} AND owner = ? AND token = 0",
            f"SELECT owner, token, expires_at, {now} FROM {locks} WHERE {key}",
            "COMMIT",
        ]
        self._grab = table.render(";\n".join(grab))
        sweep = dialect.sweep_expired(locks).replace("?", now)
        self._grab_and_sweep = table.render(";\n".join([*grab, sweep]))
        self._drop = table.render(
            f"DELETE FROM {locks} WHERE {key} AND owner = ? AND token = ? AND expires_at > {now};"
            f"\nDELETE FROM {locks} WHERE {key} AND owner = ? AND token = ?"
        )
        self._grabs = 0

    def grab(self, name: str, owner: str, ttl: float) -> Script[Granted | Busy | None]:
        """WRITE, one round trip: take a free ``name``; ``None``: the table's
        :meth:`~LockTable.attempt` must decide (an expired row, the owner's own row)."""
        ns, key = self.table.namespace, self.table.key(name)
        self._grabs += 1
        sql = self._grab_and_sweep if self._grabs % self.sweep_every == 0 else self._grab
        params: tuple[Any, ...] = (ns, key, owner, micros(ttl), ns, key, owner)  # the INSERT
        params += (ns, key)  # the counter, bumped only if the INSERT inserted
        params += (ns, key, owner)  # its new value becomes our new row's token
        params += (ns, key)  # the row as it is now
        results: list[tuple[int, list[Any]]] = yield Batch(sql, params, retry_safe=True)
        granted = results[3][0] == 1
        rows = results[4][1]
        if not rows:
            return Busy()  # free, but a live waiter of another owner is first in line
        holder, token, expires_at, now = rows[0]
        if granted:
            return Granted(int(token))
        if holder != owner and expires_at > now:
            return Busy((expires_at - now) / 1e6)
        return None

    def drop(self, name: str, owner: str, token: int) -> Script[bool]:
        """WRITE, one round trip: delete ``name``'s row if it is ``owner``'s with ``token``;
        True if it was still live (as :meth:`LockTable.release`)."""
        ns, key = self.table.namespace, self.table.key(name)
        results = yield Batch(self._drop, (ns, key, owner, token, ns, key, owner, token))
        return bool(results[0][0] == 1)
