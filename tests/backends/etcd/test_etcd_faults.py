"""Processes and faults: a killed holder process, a paused member, a cluster's leader."""

from __future__ import annotations

import asyncio
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
from tests.servers import EtcdCluster, EtcdServer

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


async def test_mutual_exclusion_across_processes(
    etcd_server: EtcdServer, namespace: str, tmp_path: Path
) -> None:
    url = f"{etcd_server.url}?namespace={namespace}&watchdog_ttl=5"
    assert_exclusive(await run_cycles(url, 3, 15, tmp_path / "log.txt"), 3, 15)


async def test_killed_holder_process_frees_the_lock_within_the_ttl(
    etcd_server: EtcdServer, namespace: str, make_client: ClientFactory
) -> None:
    ttl = 2.0
    url = f"{etcd_server.url}?namespace={namespace}&watchdog_ttl={ttl}"
    proc = await start_worker("hold", url, "crash")
    try:
        held = await read_line(proc, timeout=60)
        assert held.startswith("HELD ")
        client = await make_client()
        waiter = asyncio.create_task(client.lock("crash").acquire(timeout=HANG))
        await eventually(lambda: _waiters(client, "crash", 1))
        killed = time.monotonic()
        proc.kill()
        lease = await asyncio.wait_for(waiter, HANG)
        waited = time.monotonic() - killed
        # the lease's last keep-alive was at most ttl/3 before the kill; etcd's lessor
        # looks for expired leases every 0.5 s
        assert waited < ttl + 1.0
        assert lease.token > int(held.split()[1])
    finally:
        await reap(proc)


async def _waiters(client: aiodlock.Client, name: str, n: int) -> bool:
    status = await client.status(name)
    return status is not None and status.waiters == n


async def test_paused_member_times_out_and_the_holder_loses_its_lease(
    etcd_factory: Callable[..., EtcdServer], namespace: str, make_client: ClientFactory
) -> None:
    server = etcd_factory()
    ttl = 2.0
    client = await make_client(server.url, op_timeout=0.5, watchdog_ttl=ttl)
    other = await make_client(server.url, op_timeout=0.5)
    lost = asyncio.Event()
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock("paused"):
            entered.set()
            await asyncio.sleep(HANG)

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), HANG)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(aiodlock.BackendError):
            await other.lock("paused").acquire(timeout=HANG)
        assert time.monotonic() - started < 3.0  # bounded by op_timeout, not by HANG
        with pytest.raises(aiodlock.LockLost):
            await asyncio.wait_for(task, HANG)
        lost.set()
        assert time.monotonic() - started < ttl + 2.0
    finally:
        server.resume()
    assert lost.is_set()

    async def works() -> bool:
        try:
            lease = await other.lock("paused").try_acquire()
        except aiodlock.BackendError:
            return False
        if lease is None:
            # (the timed-out attempt's put may land as the member resumes: its clean-up
            # deletes it once the member answers again)
            return False
        await other.lock("paused").release()
        return True

    await eventually(works, what="locking works again after the pause")


async def test_leader_killed_locking_goes_on(
    etcd_cluster: Callable[..., EtcdCluster], namespace: str, make_client: ClientFactory
) -> None:
    cluster = etcd_cluster(3)
    client = await make_client(cluster.url, op_timeout=1.0, watchdog_ttl=5.0)
    other = await make_client(cluster.url, op_timeout=1.0, watchdog_ttl=5.0)
    entered = asyncio.Event()
    leave = asyncio.Event()

    async def body() -> None:
        async with client.lock("failover"):
            entered.set()
            await leave.wait()

    holder = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), HANG)
    cluster.leader().kill()
    # the holder's lease rides out the election (keep-alives go to the others)
    assert await _eventually_busy(other, "failover")
    await asyncio.sleep(6.0)  # longer than the lease's TTL: it must have been kept alive
    assert not holder.done()
    leave.set()
    await asyncio.wait_for(holder, HANG)

    async def acquired() -> bool:
        try:
            lease = await other.lock("failover").try_acquire()
        except aiodlock.BackendError:
            return False
        if lease is None:
            return False
        await other.lock("failover").release()
        return True

    await eventually(acquired, what="the lock is taken again after the leader's death")


async def _eventually_busy(client: aiodlock.Client, name: str) -> bool:
    async def busy() -> bool:
        try:
            return await client.lock(name).try_acquire() is None
        except aiodlock.BackendError:
            return False

    await eventually(busy, what="the cluster answers that the lock is held")
    return True


async def test_two_of_three_killed_never_grants_falsely(
    etcd_cluster: Callable[..., EtcdCluster], namespace: str, make_client: ClientFactory
) -> None:
    cluster = etcd_cluster(3)
    client = await make_client(cluster.url, op_timeout=0.5)
    other = await make_client(cluster.url, op_timeout=0.5)
    lock = client.lock("quorum")
    await lock.acquire()
    members = cluster.running_members()
    members[0].kill()
    members[1].kill()
    for _ in range(3):
        with pytest.raises((aiodlock.BackendError, aiodlock.LockTimeout)):
            await other.lock("quorum").acquire(timeout=1.0)
    with pytest.raises(aiodlock.BackendError):
        await lock.release()  # (the release cannot be confirmed without a quorum)
