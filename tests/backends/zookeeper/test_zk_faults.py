"""Processes and faults: killed holders, restarts, outages, pauses, ensemble failover."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aiodlock
from tests.helpers import assert_exclusive, read_line, reap, run_cycles, start_worker
from tests.servers import ZooKeeperEnsemble, ZooKeeperServer

from .zk_helpers import (
    HANG,
    ClientFactory,
    RawFactory,
    backend_of,
    children,
    eventually,
    queue_length,
)

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


async def test_mutual_exclusion_across_processes(
    zookeeper_server: ZooKeeperServer, namespace: str, tmp_path: Path
) -> None:
    url = f"{zookeeper_server.url}?namespace={namespace}&session_timeout=5"
    assert_exclusive(await run_cycles(url, 3, 15, tmp_path / "log.txt"), 3, 15)


async def test_killed_holder_process_frees_the_lock_when_its_session_expires(
    zookeeper_server: ZooKeeperServer, make_client: ClientFactory, namespace: str
) -> None:
    url = f"{zookeeper_server.url}?namespace={namespace}&session_timeout=1.5"
    proc = await start_worker("hold", url, "victim")
    try:
        line = await read_line(proc)
        assert line.startswith("HELD ")
        held_token = int(line.split()[1])
        client = await make_client()
        waiter = asyncio.create_task(_take_and_release(client, "victim"))
        status = await client.lock("victim").status()
        assert status is not None
        assert status.token == held_token
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        async with asyncio.timeout(HANG):
            token = await waiter
        waited = time.monotonic() - killed
    finally:
        await reap(proc)
    assert token > held_token
    assert waited >= 0.8  # the lock was not given away before the session could expire


async def _take_and_release(client: aiodlock.Client, name: str) -> int:
    async with client.lock(name) as lease:
        return lease.token


async def test_server_restart_within_the_session_timeout_keeps_the_lock(
    zookeeper_factory: Callable[..., ZooKeeperServer],
    make_client: ClientFactory,
    raw: RawFactory,
) -> None:
    server = zookeeper_factory()
    client = await make_client(server.url, session_timeout=20)
    backend = backend_of(client)
    lock = client.lock("restart")
    async with lock as lease:
        session_id = backend.session_id
        await asyncio.to_thread(server.restart)
        await eventually(lambda: backend.session is not None and backend.session.connected)
        assert backend.session_id == session_id
        assert not lease.lost
        other = await make_client(server.url)
        status = await other.lock("restart").status()
        assert status is not None
        assert status.owner == lease.owner
        assert await other.lock("restart").try_acquire() is None
        await lock.extend()  # the node is still ours
    # the release went through: the next owner gets the lock at once
    async with other.lock("restart", timeout=5):
        pass
    zk = await raw(server.address)
    assert await children(zk, backend.lock_path("restart")) == []


async def test_release_while_the_server_restarts_is_retried(
    zookeeper_factory: Callable[..., ZooKeeperServer],
    make_client: ClientFactory,
    raw: RawFactory,
) -> None:
    """drivers.md pitfall 7: a delete sent while the server is down must not be dropped."""
    server = zookeeper_factory()
    client = await make_client(server.url, session_timeout=30, op_timeout=30)
    backend = backend_of(client)
    lock = client.lock("jam")
    await lock.acquire()
    await asyncio.to_thread(server.stop)

    def start_later() -> None:
        time.sleep(0.5)  # the server is not even spawned before this
        server.start()

    starting = asyncio.create_task(asyncio.to_thread(start_later))
    began = time.monotonic()
    async with asyncio.timeout(HANG):
        await lock.release()  # waits for the server rather than giving up
    assert time.monotonic() - began >= 0.5
    await starting
    zk = await raw(server.address)
    assert await children(zk, backend.lock_path("jam")) == []
    other = await make_client(server.url)
    async with other.lock("jam", timeout=5):
        pass


async def test_server_down_longer_than_the_session_timeout_loses_the_lock(
    zookeeper_factory: Callable[..., ZooKeeperServer],
    make_client: ClientFactory,
) -> None:
    server = zookeeper_factory()
    client = await make_client(server.url, session_timeout=1.5, op_timeout=2)
    held = asyncio.Event()
    body_cancelled = False

    async def body() -> None:
        nonlocal body_cancelled
        async with client.lock("outage"):
            held.set()
            try:
                await asyncio.sleep(HANG)
            except asyncio.CancelledError:
                body_cancelled = True
                raise

    task = asyncio.create_task(body())
    await held.wait()
    await asyncio.to_thread(server.kill)
    killed = time.monotonic()
    with pytest.raises(aiodlock.LockLost, match="session"):
        async with asyncio.timeout(HANG):
            await task
    assert body_cancelled
    assert time.monotonic() - killed < 1.5 + 2.0  # the session timeout, plus slack for load
    await asyncio.to_thread(server.start)
    # new acquisitions work once the server is back (in a new or revived session)
    async with client.lock("outage", timeout=HANG) as lease:
        assert not lease.lost
    other = await make_client(server.url)
    async with other.lock("outage", timeout=HANG):
        pass


async def test_paused_server_longer_than_the_session_timeout_loses_the_lock(
    zookeeper_factory: Callable[..., ZooKeeperServer],
    make_client: ClientFactory,
) -> None:
    server = zookeeper_factory()
    client = await make_client(server.url, session_timeout=1.5, op_timeout=2)
    lease = await client.lock("pause", on_lost="ignore").acquire()
    server.pause()
    try:
        async with asyncio.timeout(HANG):
            await lease.wait_lost()
        assert "may have expired" in (lease.lost_reason or "")
        with pytest.raises((aiodlock.BackendError, aiodlock.LockTimeout)):
            await client.lock("pause-other").acquire(timeout=1)
    finally:
        server.resume()
    await client.lock("pause").release()
    async with client.lock("pause", timeout=HANG):
        pass


async def test_one_of_three_ensemble_members_killed_locking_continues(
    zookeeper_ensemble: Callable[..., ZooKeeperEnsemble],
    make_client: ClientFactory,
    raw: RawFactory,
) -> None:
    ensemble = zookeeper_ensemble(3)
    a = await make_client(ensemble.url, session_timeout=8)
    b = await make_client(ensemble.url, session_timeout=8)
    backend = backend_of(a)
    lock = a.lock("quorum")
    async with lock as lease:
        assert backend.session is not None
        conn = backend.session.conn
        assert conn is not None
        victim = next(m for m in ensemble if m.port == conn.port)
        session_id = backend.session_id
        await asyncio.to_thread(victim.kill)
        waiter = asyncio.create_task(_take_and_release(b, "quorum"))
        await eventually(lambda: _connected_elsewhere(backend, victim.port))
        assert backend.session_id == session_id
        assert not lease.lost
        await lock.extend()
        assert not waiter.done()
    async with asyncio.timeout(HANG):
        assert await waiter > lease.token
    for i in range(10):
        async with a.lock(f"after/{i}", timeout=HANG), b.lock(f"other/{i}", timeout=HANG):
            pass
    hosts = ",".join(m.address for m in ensemble if m is not victim)
    zk = await raw(hosts)
    assert await queue_length(a, zk, "quorum") == 0


def _connected_elsewhere(backend: Any, port: int) -> bool:
    session = backend.session
    return bool(session.connected and session.conn.port != port)
