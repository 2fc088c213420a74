"""Helpers of the PostgreSQL backend tests."""

from __future__ import annotations

import asyncpg

import aiodlock
from aiodlock.backends.postgres import PostgresBackend
from aiodlock.backends.postgres import _statements as sql
from aiodlock.backends.postgres.table import LISTENERS


def backend_of(client: aiodlock.Client) -> PostgresBackend:
    backend = client.backend
    assert isinstance(backend, PostgresBackend)
    return backend


async def holders(conn: asyncpg.Connection, key: int) -> list[int]:
    """The server pids of the sessions holding the advisory lock ``key``."""
    rows = await conn.fetch(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
        " AND classid::bigint = (($1::bigint >> 32) & 4294967295)"
        " AND objid::bigint = ($1::bigint & 4294967295)",
        key,
    )
    return [r["pid"] for r in rows]


async def line(conn: asyncpg.Connection, client: aiodlock.Client, key: int) -> list[int]:
    """The LISTEN sessions waiting for ``key`` (either strategy).  A row of a session that has
    ended counts as gone, as it does for the backends (a join cut short ends its session)."""
    backend = client.backend
    table = f"{backend.table}_waiters" if isinstance(backend, PostgresBackend) else LISTENERS
    rows = await conn.fetch(
        f'SELECT pid FROM "{table}" w WHERE key = $1'
        " AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)",
        key,
    )
    return [r["pid"] for r in rows]


async def marked_by(conn: asyncpg.Connection, key: int) -> list[int]:
    """The server pids of the sessions holding the line mark of ``key`` (shared, each once)."""
    rows = await conn.fetch(
        "SELECT l.pid FROM pg_locks l, (SELECT "
        + sql.MARK.replace(", ", " AS hi, ", 1)
        + " AS lo) m WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
        " AND l.mode = 'ShareLock' AND l.classid::bigint = (m.hi::bigint & 4294967295)"
        " AND l.objid::bigint = (m.lo::bigint & 4294967295) ORDER BY l.pid",
        key,
    )
    return [r["pid"] for r in rows]


async def mark(conn: asyncpg.Connection, key: int, *, held: bool = True) -> None:
    """Take (or give back) the line mark of ``key`` on ``conn``'s session, as a client with a
    row in its line holds it (for a row a test makes by hand)."""
    what = "pg_advisory_lock_shared" if held else "pg_advisory_unlock_shared"
    await conn.execute(f"SELECT {what}({sql.MARK})", key)
