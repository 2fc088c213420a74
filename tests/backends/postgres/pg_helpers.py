"""Helpers of the PostgreSQL backend tests."""

from __future__ import annotations

import asyncpg

import aiodlock
from aiodlock.backends.postgres import PostgresBackend
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
