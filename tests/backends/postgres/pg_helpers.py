"""Helpers of the PostgreSQL backend tests."""

from __future__ import annotations

import asyncio

import asyncpg

import aiodlock
from aiodlock.backends.postgres import PostgresBackend
from tests.helpers import HANG, worker_command, worker_env


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


async def start_worker(*args: str) -> asyncio.subprocess.Process:
    """Run tests/worker.py in another Python process."""
    return await asyncio.create_subprocess_exec(
        *worker_command(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=worker_env(),
    )


async def read_line(proc: asyncio.subprocess.Process, timeout: float = HANG) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(timeout):
        line = await proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        err = await proc.stderr.read()
        raise AssertionError(f"worker ended early: {err.decode(errors='replace')[-2000:]}")
    return line.decode().strip()


async def reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
