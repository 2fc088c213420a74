"""Helpers of the PostgreSQL backend tests."""

from __future__ import annotations

import asyncpg

import aiodlock
from aiodlock.backends.postgres import PostgresBackend


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
    """The LISTEN sessions in the waiters table for ``key``."""
    table = backend_of(client).table
    rows = await conn.fetch(f'SELECT pid FROM "{table}_waiters" WHERE key = $1', key)
    return [r["pid"] for r in rows]
