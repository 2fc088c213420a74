"""Sentinel and Cluster deployments started on loopback by the fixtures (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

import aiodlock
from aiodlock._types import Grant, Request
from aiodlock.backends.redis._deployments import ClusterLinks, ServerLinks
from tests.servers import ClusterDeployment, SentinelDeployment

from .redis_helpers import HANG, ClientFactory, Monitor, backend_of, eventually, writes

pytestmark = pytest.mark.redis


def _script_then_wait(monitor: Monitor) -> bool:
    """The server ran one acquire script and, next from that connection, one WAIT."""
    runs = [c for c in monitor.commands if c["command"].upper().startswith("EVALSHA")]
    if len(runs) != 1:
        return False
    sent = monitor.by(runs[0]["client_port"])
    return sent.count("EVALSHA") == 1 and sent[-2:] == ["EVALSHA", "WAIT"]


# -- Sentinel -----------------------------------------------------------------------------------


async def test_sentinel_locks_and_wakes(
    sentinel_deployment: SentinelDeployment, make_client: ClientFactory
) -> None:
    url = sentinel_deployment.url
    a = await make_client(url)
    b = await make_client(url)
    assert "sentinel" in repr(a)
    lock = a.lock("s:1")
    async with lock as lease:
        assert await b.lock("s:1").try_acquire() is None
        status = await b.status("s:1")
        assert status is not None
        assert status.owner == lease.owner
        waiting = asyncio.create_task(b.lock("s:1").acquire(timeout=HANG))
        await eventually(lambda: bool(backend_of(b).hub.channels()))
        released = time.monotonic()
    second = await asyncio.wait_for(waiting, HANG)
    assert time.monotonic() - released < 2.0
    assert second.token > lease.token
    # the data lives on the master the sentinels name
    master = sentinel_deployment.master
    assert master.port == sentinel_deployment.master_port()


async def test_sentinel_with_sync_replicas(
    sentinel_deployment: SentinelDeployment, make_client: ClientFactory, raw_factory: Any
) -> None:
    a = await make_client(sentinel_deployment.url, sync_replicas=1, sync_timeout=1.0)
    master = raw_factory(sentinel_deployment.master.url)
    async with Monitor(master) as monitor, a.lock("sync") as lease:
        await monitor.sync()
        assert _script_then_wait(monitor)  # script and WAIT in one round trip
        assert lease.token >= 1
    too_many = await make_client(sentinel_deployment.url, sync_replicas=2, sync_timeout=0.2)
    with pytest.raises(aiodlock.BackendError, match="replicas acknowledged"):
        await too_many.lock("sync").acquire()
    assert await a.status("sync") is None  # the unconfirmed grant was released again


@pytest.mark.slow
async def test_a_sentinel_that_stops_answering_is_passed_over(
    sentinel_deployment: SentinelDeployment, make_client: ClientFactory
) -> None:
    """The first sentinel of the URL is frozen: a new connection asks it for a share of
    ``connect_timeout``, then the next one, which is asked first from then on."""
    first, second = sentinel_deployment.sentinels[:2]
    await asyncio.to_thread(first.pause)
    try:
        client = await make_client(sentinel_deployment.url, op_timeout=5.0, connect_timeout=5.0)
        async with client.lock("s:frozen") as lease:
            assert lease.token >= 1
        links = backend_of(client).links
        assert isinstance(links, ServerLinks)
        assert links.sentinels[0].label.endswith(f":{second.port}")
    finally:
        await asyncio.to_thread(first.resume)


@pytest.mark.slow
async def test_failover_with_sync_replicas_keeps_the_lock(
    sentinel_factory: Any, make_client: ClientFactory
) -> None:
    deployment: SentinelDeployment = sentinel_factory()
    await asyncio.to_thread(deployment.wait_failover_ready)
    assert deployment.replica is not None
    url = deployment.url
    options = {"sync_replicas": 1, "watchdog_ttl": 9.0, "op_timeout": 1.0, "sync_timeout": 0.5}
    holder = await make_client(url, **options)
    other = await make_client(url, op_timeout=1.0, watchdog_ttl=9.0)
    lease = await holder.lock("failover").acquire()
    # a waiter of a third client, asleep before the failover, rides it out
    sleeper = await make_client(url, op_timeout=1.0, watchdog_ttl=9.0)
    asleep = asyncio.create_task(sleeper.lock("failover").acquire(timeout=60))
    await eventually(lambda: backend_of(sleeper).hub.channels() != [])

    killed = time.monotonic()
    await asyncio.to_thread(deployment.master.kill)
    await asyncio.to_thread(deployment.wait_master, deployment.replica.port)

    # The promoted replica has the lock (WAIT made sure it had the grant).
    status: aiodlock.LockStatus | None = None
    failure: aiodlock.BackendError | None = None

    async def found() -> bool:
        nonlocal status, failure
        try:
            status = await other.status("failover")
        except aiodlock.BackendError as exc:
            failure = exc  # still on its way to the new master
        return status is not None

    try:
        await eventually(found, what="the lock on the promoted replica")
    except AssertionError as exc:
        # (seen once, not understood: say what each server said then)
        state = await asyncio.to_thread(deployment.describe)
        links = backend_of(other).links
        asked = [s.label for s in links.sentinels] if isinstance(links, ServerLinks) else []
        raise AssertionError(
            f"{exc}; the last failure: {failure!r}; the client asks {asked} in turn\n{state}"
        ) from None
    assert status is not None
    assert (status.owner, status.token) == (lease.owner, lease.token)
    assert await other.lock("failover").try_acquire() is None
    # (A call in flight during the failover may fail with BackendError; a waiter started
    # after it waits normally.)
    waiting = asyncio.create_task(other.lock("failover").acquire(timeout=60))
    # The holder's watchdog renews on the new master: the lease outlives its first ttl.
    await eventually(
        lambda: time.monotonic() - killed > 9.0 + 1.0, timeout=30, what="one ttl went by"
    )
    assert not lease.lost, lease.lost_reason
    assert not waiting.done()
    assert not asleep.done(), asleep.exception() if asleep.done() else None
    await holder.lock("failover").release()
    leases = await asyncio.wait_for(asyncio.gather(waiting, asleep), 30)
    # the counter came over with the grant (WAIT); both waiters got it in turn
    assert sorted(second.token for second in leases) == [lease.token + 1, lease.token + 2]


# -- Cluster ------------------------------------------------------------------------------------


def master_port(client: aiodlock.Client, name: str) -> int:
    """The port of the master that serves lock ``name``'s slot, as ``client`` knows it."""
    backend = backend_of(client)
    cluster = backend.links
    assert isinstance(cluster, ClusterLinks)
    address = cluster.address_of(backend.keys_for(name).lock)
    assert address is not None
    return address.port


async def test_cluster_locks_on_every_node(
    cluster_deployment: ClusterDeployment, make_client: ClientFactory
) -> None:
    url = cluster_deployment.url  # two of the three nodes: the third is discovered
    a = await make_client(url)
    b = await make_client(url)
    names = [f"c:{i}" for i in range(30)] + ["{", "}", "a{b}c", "ünï {x}"]
    cluster = backend_of(a).links
    assert isinstance(cluster, ClusterLinks)
    nodes = {cluster.address_of(backend_of(a).keys_for(name).lock) for name in names}
    assert len(nodes) == 3  # the names land on all three masters
    for name in names:
        await a.lock(name).acquire()
    for name in names:
        assert await b.lock(name).try_acquire() is None
        status = await b.status(name)
        assert status is not None
        assert status.owner.startswith(a.id)
    for name in names:
        await a.lock(name).release()
    for name in names:
        assert await b.status(name) is None


async def test_cluster_release_wakes_waiters_on_any_node(
    cluster_deployment: ClusterDeployment, make_client: ClientFactory
) -> None:
    a = await make_client(cluster_deployment.url)
    b = await make_client(cluster_deployment.url)
    names = [f"w:{i}" for i in range(6)]
    for name in names:
        await a.lock(name).acquire()
    tasks = [asyncio.create_task(b.lock(name).acquire(timeout=HANG)) for name in names]
    hub = backend_of(b).hub
    await eventually(lambda: len(hub.channels()) == len(names))
    await eventually(lambda: all(hub.is_ready(ch) for ch in hub.channels()))
    released = time.monotonic()
    for name in names:
        await a.lock(name).release()
    leases = await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    assert time.monotonic() - released < 3.0  # woken by messages, not lease ends
    assert all(lease.token >= 2 for lease in leases)


async def test_cluster_fair_and_renewals_grouped_by_node(
    cluster_deployment: ClusterDeployment, make_client: ClientFactory
) -> None:
    a = await make_client(cluster_deployment.url)
    backend = backend_of(a)
    grants = []
    for i in range(60):
        grant = await backend.try_acquire(Request(f"r:{i}", "owner:1", 5.0), will_wait=False)
        assert isinstance(grant, Grant)
        grants.append(grant)
    cluster = backend.links
    assert isinstance(cluster, ClusterLinks)
    masters = {cluster.address_of(backend.keys_for(g.name).lock) for g in grants}
    with writes(*(cluster.link_to(m) for m in masters if m is not None)) as sent:
        started = time.monotonic()
        results = await backend.renew(grants, 8.0)
    assert len(sent) == len(masters) == 3  # one pipeline, split by node
    assert all(r is not None and r >= started + 8.0 for r in results)
    for grant in grants:
        assert await backend.release(grant)
    # fair mode on a cluster
    holder = a.lock("fair", fair=True)
    await holder.acquire()
    b = await make_client(cluster_deployment.url)
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with b.lock("fair", fair=True, timeout=HANG):
            order.append(i)

    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(waiter(i)))

        async def queued(n: int = i + 1) -> bool:
            status = await a.status("fair")
            return status is not None and (status.waiters or 0) >= n

        await eventually(queued)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    assert order == [0, 1, 2]


async def test_cluster_ready_made_client(
    cluster_deployment: ClusterDeployment, namespace: str
) -> None:
    node = cluster_deployment.nodes[0]
    mine = RedisCluster(host="127.0.0.1", port=node.port)
    try:
        c = aiodlock.connect("redis+cluster://", client=mine, namespace=namespace)
        async with c, c.lock("ext") as lease:
            assert lease.token >= 1
        assert await mine.ping()
    finally:
        await mine.aclose()


@pytest.mark.slow
async def test_cluster_sync_replicas_waits_on_the_slots_master(
    cluster_factory: Any, make_client: ClientFactory, raw_factory: Any
) -> None:
    deployment: ClusterDeployment = cluster_factory()
    with_replica = deployment.nodes[0]
    await asyncio.to_thread(deployment.add_replica, with_replica)
    client = await make_client(deployment.url, sync_replicas=1, sync_timeout=0.3)
    names = [f"n{i}" for i in range(40)]
    replicated = next(n for n in names if master_port(client, n) == with_replica.port)
    alone = next(n for n in names if master_port(client, n) != with_replica.port)
    async with Monitor(raw_factory(with_replica.url)) as monitor, client.lock(replicated) as lease:
        await monitor.sync()
        assert _script_then_wait(monitor)  # the script and WAIT: one pipeline
        assert lease.token >= 1
    # the slot's master has no replica: the grant is not confirmed, and not kept
    with pytest.raises(aiodlock.BackendError, match="replicas acknowledged"):
        await client.lock(alone).acquire()
    assert await client.status(alone) is None


@pytest.mark.slow
async def test_cluster_failover_with_sync_replicas_keeps_the_lock(
    cluster_factory: Any, make_client: ClientFactory
) -> None:
    # The master of the lock's slot is killed; its replica (which WAIT made sure had the
    # grant and the counter) is elected in its place.  The holder keeps the lock, renews it
    # on the new master, and waiters of other clients, asleep before the failover (their
    # pub/sub connections on the dead master: every hub starts on the first node), ride it
    # out and get the lock after the release.
    # NOTE: the lease must outlast the failover: the cluster elects the replica after its
    # node timeout (2 s) and an election (up to ~1.5 s, longer on a loaded machine), and the
    # holder's last renewal may be ttl/3 old when the master dies.
    ttl = 10.0
    deployment: ClusterDeployment = cluster_factory()
    doomed = deployment.nodes[0]
    replica = await asyncio.to_thread(deployment.add_replica, doomed)
    options = {"sync_replicas": 1, "sync_timeout": 0.5, "watchdog_ttl": ttl, "op_timeout": 1.0}
    holder = await make_client(deployment.url, **options)
    other = await make_client(deployment.url, watchdog_ttl=ttl, op_timeout=1.0)
    name = next(n for n in (f"c{i}" for i in range(100)) if master_port(holder, n) == doomed.port)
    lease = await holder.lock(name).acquire()
    sleepers = [await make_client(deployment.url, watchdog_ttl=ttl, op_timeout=1.0) for _ in "ab"]
    asleep = [asyncio.create_task(c.lock(name).acquire(timeout=60)) for c in sleepers]
    for c in sleepers:
        await eventually(
            lambda c=c: backend_of(c).hub.is_ready(backend_of(c).keys_for(name).channel)
        )

    killed = time.monotonic()
    await asyncio.to_thread(doomed.kill)
    await asyncio.to_thread(deployment.wait_promoted, replica)

    status: aiodlock.LockStatus | None = None

    async def found() -> bool:
        nonlocal status
        try:
            status = await other.status(name)
        except aiodlock.BackendError:
            return False  # the client is still learning the new slot map
        return status is not None

    await eventually(found, what="the lock on the promoted replica")
    assert status is not None
    assert (status.owner, status.token) == (lease.owner, lease.token)
    assert await other.lock(name).try_acquire() is None
    waiting = asyncio.create_task(other.lock(name).acquire(timeout=60))
    # The holder's watchdog renews on the new master: the lease outlives its first ttl.
    await eventually(
        lambda: time.monotonic() - killed > ttl + 1.0, timeout=30, what="one ttl went by"
    )
    assert not lease.lost, lease.lost_reason
    assert not waiting.done()
    assert not any(task.done() for task in asleep), [t.exception() for t in asleep if t.done()]
    await holder.lock(name).release()
    leases = await asyncio.wait_for(asyncio.gather(waiting, *asleep), 30)
    tokens = [second.token for second in leases]
    # the counter came over with the grant (WAIT); each waiter got it in turn (the tasks
    # ended holding it: their clients released it)
    assert sorted(tokens) == list(range(lease.token + 1, lease.token + 4))


@pytest.mark.slow
async def test_cluster_resharding_moves_a_held_lock_with_its_counter(
    cluster_factory: Any, make_client: ClientFactory
) -> None:
    # The slot of a held lock moves to another master (keys, expiry and the fencing
    # counter together, one hash tag): the holder's renewals and release follow the MOVED
    # answers there, and a waiter of another client gets it with a larger token.
    deployment: ClusterDeployment = cluster_factory()
    holder = await make_client(deployment.url, watchdog_ttl=3.0)
    other = await make_client(deployment.url, watchdog_ttl=3.0)
    keys = backend_of(holder).keys_for("moving")
    source = next(node for node in deployment.nodes if node.port == master_port(holder, "moving"))
    target = next(node for node in deployment.nodes if node is not source)
    lease = await holder.lock("moving").acquire()

    moved = await asyncio.to_thread(deployment.migrate_slot, key_slot(keys.lock), source, target)
    migrated = time.monotonic()
    assert moved == 2  # the lock hash and the fencing counter
    assert int(target.cli("PTTL", keys.lock.decode())) > 0  # (its expiry came along)
    status = await other.status("moving")
    assert status is not None
    assert (status.owner, status.token) == (lease.owner, lease.token)
    waiting = asyncio.create_task(other.lock("moving").acquire(timeout=60))
    # The watchdog renews on the new master (ttl 3 s, renewed every second).
    await eventually(
        lambda: time.monotonic() - migrated > 3.0 + 1.0, timeout=30, what="one ttl went by"
    )
    assert not lease.lost, lease.lost_reason
    assert not waiting.done()
    assert int(target.cli("PTTL", keys.lock.decode())) > 1000
    await holder.lock("moving").release()
    second = await asyncio.wait_for(waiting, 30)
    assert second.token == lease.token + 1  # the counter moved with the lock
    assert source.cli("CLUSTER", "COUNTKEYSINSLOT", str(key_slot(keys.lock))) == "0"
