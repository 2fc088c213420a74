"""The advisory strategy's urgent line: a waiter that has waited URGENT_AFTER marks its
client's row in the waiters table, and no attempt of another client barges past it; a
release calls the urgent client first.  Across OS processes this bounds starvation."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

import aiodlock
from aiodlock.backends.postgres import PostgresBackend
from aiodlock.backends.postgres import _statements as sql
from benchmarks import crossprocess
from tests.helpers import HANG, ClientFactory, eventually
from tests.servers import PostgresServer

from .conftest import RawFactory
from .pg_helpers import backend_of, holders, mark


async def _urgent(conn: asyncpg.Connection, client: aiodlock.Client, key: int) -> list[int]:
    """The LISTEN sessions with an urgent row for ``key``, first in line first."""
    table = f'"{backend_of(client).table}_waiters"'
    rows = await conn.fetch(
        f"SELECT pid FROM {table} WHERE key = $1 AND urgent_since IS NOT NULL"
        " ORDER BY urgent_since, pid",
        key,
    )
    return [r["pid"] for r in rows]


async def _hold(client: aiodlock.Client, name: str, go: asyncio.Event) -> int:
    """Take ``name`` (the token), hold it until ``go``."""
    async with client.lock(name, timeout=HANG) as lease:
        await go.wait()
        return lease.token


async def test_nobody_barges_past_an_urgent_waiter(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn = await raw()
    holder, first, second, plain = [await make_client() for _ in range(4)]
    key = backend_of(holder).key("line")
    await holder.lock("line").acquire()
    go_first, go_second = asyncio.Event(), asyncio.Event()
    waiting = asyncio.create_task(_hold(first, "line", go_first))
    pids = [backend_of(first).listener]

    async def lined_up() -> bool:
        return await _urgent(conn, holder, key) == [x.pid for x in pids]

    await eventually(lined_up, what="the first waiter urgent")
    later = asyncio.create_task(_hold(second, "line", go_second))
    pids.append(backend_of(second).listener)
    await eventually(lined_up, what="the second waiter urgent, behind the first")
    # The first urgent client cannot ask meanwhile (its holder connection is busy): the
    # released lock stays free, and nobody else takes it.
    busy = backend_of(first).holder
    await busy.begin()
    try:
        heard = backend_of(first).listener.heard
        await holder.lock("line").release()
        assert await plain.lock("line").try_acquire() is None
        with pytest.raises(aiodlock.LockTimeout):
            await plain.lock("line").acquire(timeout=0.1)
        assert await holders(conn, key) == []
        assert not later.done()
        # (the release called it; the attempts that found the lock free, barred, were not
        # called themselves, and leave the call to the release's)
        listener = backend_of(first).listener
        await eventually(lambda: listener.heard >= heard + 1, what="the release's call heard")
    finally:
        busy.end()
    await eventually(lambda: _held_by(conn, key, backend_of(first)), what="first's grant")
    assert not later.done()
    go_first.set()
    token = await asyncio.wait_for(waiting, HANG)
    await eventually(lambda: _held_by(conn, key, backend_of(second)), what="second's grant")
    go_second.set()
    assert await asyncio.wait_for(later, HANG) == token + 1
    assert await _urgent(conn, holder, key) == []  # (every row left with its waiters)


async def _held_by(conn: asyncpg.Connection, key: int, backend: PostgresBackend) -> bool:
    return await holders(conn, key) == [backend.holder.pid]


async def test_an_urgent_row_of_a_dead_session_bars_nobody(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn = await raw()
    client = await make_client()
    key = backend_of(client).key("ghost")
    table = f'"{backend_of(client).table}_waiters"'
    dead = 2**31 - 1  # (no such server process)
    await conn.execute(
        f"INSERT INTO {table} (key, pid, urgent_since) VALUES ($1, $2, now())", key, dead
    )
    # (somebody is in the line, as its mark shows: the attempt reads the line, and finds
    # the urgent row's session gone)
    await mark(conn, key)
    lease = await client.lock("ghost").try_acquire()
    assert lease is not None
    await client.lock("ghost").release()
    await conn.execute(f"DELETE FROM {table} WHERE key = $1", key)
    await mark(conn, key, held=False)


async def test_a_client_is_not_barred_by_its_own_urgent_row(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn = await raw()
    client, other, blocker = [await make_client() for _ in range(3)]
    await blocker.lock("elsewhere").acquire()
    go = asyncio.Event()
    waiting = asyncio.create_task(_hold(client, "elsewhere", go))  # (the client listens)
    listener = backend_of(client).listener
    await eventually(listener.listening, what="the client listening")
    key = backend_of(client).key("own")
    table = f'"{backend_of(client).table}_waiters"'
    insert = f"INSERT INTO {table} (key, pid, urgent_since) VALUES ($1, $2, now())"
    await conn.execute(insert, key, listener.pid)  # (another task of the client, urgent)
    await mark(conn, key)  # (its line mark, held for it)
    try:
        assert await other.lock("own").try_acquire() is None
        async with client.lock("own", timeout=0) as lease:
            assert lease.token >= 1
    finally:
        await conn.execute(f"DELETE FROM {table} WHERE key = $1", key)
        await mark(conn, key, held=False)
        waiting.cancel()
    assert await other.lock("own").try_acquire() is not None
    await other.lock("own").release()


@pytest.mark.slow
async def test_processes_share_a_contended_lock(postgres_server: PostgresServer) -> None:
    # 4 processes x 2 tasks, 1 ms holds: a release of one process would otherwise wake its
    # own other task, which takes the lock back before another process's waiter can.
    argv = ["--backend", "postgres", "--processes", "4", "--tasks", "2", "--acquisitions", "40"]
    args = crossprocess.parse_args([*argv, "--timeout", "120"])
    name = f"share-{uuid.uuid4().hex[:8]}"
    docs = await asyncio.to_thread(crossprocess._spawn, postgres_server.url, name, args)
    res = crossprocess.analyse(docs, tasks=2, acquisitions=40)
    assert res["acquisitions"] == res["expected"] == 320
    assert res["overlapping_intervals"] == 0
    assert all(not p["errors"] for p in res["per_process"])
    shares = res["share_at_first_finish"]
    # Every process got at least a quarter of the busiest one's acquisitions by the time
    # the first process finished all of its own.
    assert min(shares) * 4 >= max(shares), shares


async def test_a_line_made_before_the_urgent_mark_gets_its_column(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn = await raw()
    table = f"old_{uuid.uuid4().hex[:8]}"
    # (the waiters table as it was made before the urgent mark)
    await conn.execute(
        f'CREATE TABLE "{table}_waiters" (key bigint NOT NULL, pid integer NOT NULL,'
        " since timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (key, pid))"
    )
    try:
        client = await make_client(table=table)
        async with client.lock("x", timeout=0) as lease:
            assert lease.token == 1
        assert await conn.fetchval(sql.HAS_URGENT, f'"{table}_waiters"')
    finally:
        await conn.execute(f'DROP TABLE IF EXISTS "{table}_waiters", "{table}"')
