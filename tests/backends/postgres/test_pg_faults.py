"""Processes and faults: exclusion across OS processes, a killed holder process, a restart of
PostgreSQL while a lock is held, a server that stops answering (SIGSTOP)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import aiodlock
from tests.helpers import (
    HANG,
    ClientFactory,
    assert_exclusive,
    eventually,
    read_line,
    reap,
    run_cycles,
    start_worker,
)
from tests.servers import PostgresServer

from .conftest import RawFactory
from .pg_helpers import backend_of, holders

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def test_mutual_exclusion_across_processes(
    postgres_server: PostgresServer, namespace: str, tmp_path: Path
) -> None:
    url = f"{postgres_server.url}?namespace={namespace}"
    assert_exclusive(await run_cycles(url, 3, 15, tmp_path / "log.txt"), 3, 15)


async def test_a_killed_holder_process_frees_the_name_at_once(
    postgres_server: PostgresServer,
    make_client: ClientFactory,
    namespace: str,
    raw: RawFactory,
) -> None:
    proc = await start_worker("hold", f"{postgres_server.url}?namespace={namespace}", "victim")
    try:
        line = await read_line(proc)
        assert line.startswith("HELD ")
        conn = await raw()
        client = await make_client(poll_interval=0.5)
        key = backend_of(client).key("victim")
        assert len(await holders(conn, key)) == 1

        async def take() -> float:
            async with client.lock("victim", timeout=HANG):
                return time.monotonic()

        waiter = asyncio.create_task(take())
        await asyncio.sleep(0.1)
        assert not waiter.done()
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        # The session dies with the process's socket: the server frees the lock at once...
        await eventually(lambda: _free(conn, key), timeout=2.0, what="the lock freed")
        # ...and a waiter (no NOTIFY came: the session died) takes it at its next poll.
        took = await asyncio.wait_for(waiter, HANG)
        assert took - killed < 0.5 + 1.0
    finally:
        await reap(proc)


async def _free(conn: object, key: int) -> bool:
    return await holders(conn, key) == []  # type: ignore[arg-type]


async def _held_body(
    client: aiodlock.Client, name: str, entered: asyncio.Event, cancelled: asyncio.Event
) -> None:
    async with client.lock(name):
        entered.set()
        try:
            await asyncio.sleep(HANG * 2)
        except asyncio.CancelledError:
            cancelled.set()
            raise


async def test_a_restart_while_held_is_lock_lost_and_cancels_the_body(
    postgres_factory: Callable[..., PostgresServer], namespace: str
) -> None:
    server = postgres_factory()
    async with aiodlock.connect(server.url, namespace=namespace, op_timeout=2) as client:
        entered, cancelled = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(_held_body(client, "r", entered, cancelled))
        await asyncio.wait_for(entered.wait(), HANG)
        started = time.monotonic()
        await asyncio.to_thread(server.restart)
        with pytest.raises(aiodlock.LockLost):
            await asyncio.wait_for(task, HANG)
        assert cancelled.is_set()
        assert time.monotonic() - started < HANG
        # The client reconnects and works again.
        async with client.lock("r", timeout=HANG) as lease:
            assert not lease.lost


async def test_a_server_that_stops_answering_is_found_within_op_timeout(
    postgres_factory: Callable[..., PostgresServer], namespace: str
) -> None:
    server = postgres_factory()
    op_timeout = 1.0
    async with aiodlock.connect(
        server.url, namespace=namespace, op_timeout=op_timeout, connect_timeout=op_timeout
    ) as client:
        entered, cancelled = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(_held_body(client, "p", entered, cancelled))
        await asyncio.wait_for(entered.wait(), HANG)
        server.pause()
        paused = time.monotonic()
        try:
            with pytest.raises(aiodlock.LockLost):
                await asyncio.wait_for(task, HANG)
            lost_after = time.monotonic() - paused
            assert cancelled.is_set()
            assert lost_after < op_timeout * 1.5 + 0.5  # (the keep-alive's bound, and slack)
            # Asking a silent server fails too (a new session: within connect_timeout).
            started = time.monotonic()
            with pytest.raises(aiodlock.BackendError):
                await client.lock("q").try_acquire()
            assert time.monotonic() - started < op_timeout * 2 + 1
        finally:
            server.resume()
        # The server answers again: the session that held the lock was discarded, so the
        # lock is free, and the client takes it on a new session.
        async with client.lock("p", timeout=HANG) as lease:
            assert not lease.lost
