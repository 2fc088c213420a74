"""Faults with real servers: killed holders, restarts, pauses, cancellations, 10,000 leases."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiodlock
from tests.helpers import worker_command, worker_env

from .redis_helpers import (
    HANG,
    ClientFactory,
    Monitor,
    RawFactory,
    backend_of,
    connection_ids,
    eventually,
    keys_of,
    port_of,
    writes,
)

pytestmark = pytest.mark.redis


def _start_holder(url: str, name: str, **options: Any) -> subprocess.Popen[str]:
    args = worker_command("hold", url, name, *(f"{k}={v}" for k, v in options.items()))
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=worker_env())


@pytest.mark.slow
async def test_killed_holder_frees_the_lock_within_watchdog_ttl(
    make_client: ClientFactory, redis_url: str, namespace: str
) -> None:
    ttl = 1.5
    proc = _start_holder(redis_url, "crash", namespace=namespace, watchdog_ttl=ttl)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), HANG)
        assert line.startswith("HELD "), line
        token = int(line.split()[1])
        waiter = await make_client(watchdog_ttl=ttl)
        await asyncio.sleep(ttl)  # the holder keeps renewing while alive
        assert await waiter.lock("crash").try_acquire() is None
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        lease = await waiter.lock("crash").acquire(timeout=HANG)
        elapsed = time.monotonic() - killed
        assert elapsed <= ttl + 1.0  # the lease ran out; the waiter woke at its end
        assert lease.token > token
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
async def test_restart_without_persistence_loses_the_lease(
    redis_factory: Any, make_client: ClientFactory
) -> None:
    server = redis_factory()
    client = await make_client(server.url, watchdog_ttl=0.9, op_timeout=0.5)
    lost_seen = asyncio.Event()
    body_cancelled = False
    started = time.monotonic()
    with pytest.raises(aiodlock.LockLost):
        async with client.lock("restart", on_lost="cancel") as lease:
            await asyncio.to_thread(server.restart)
            try:
                await asyncio.sleep(HANG)
            except asyncio.CancelledError:
                body_cancelled = True
                lost_seen.set()
                raise
    assert body_cancelled
    assert lease.lost
    assert time.monotonic() - started < HANG
    # and the library keeps working against the restarted server
    async with client.lock("restart") as again:
        assert again.token == 1  # the counter was lost with the data


@pytest.mark.slow
async def test_a_waiter_outlives_a_restart_and_gets_the_lock_it_freed(
    redis_factory: Any, make_client: ClientFactory
) -> None:
    # A restart without persistence frees every lock (the documented unsafety): a waiter
    # asleep before it is woken when its pub/sub connection comes back (the hub wakes its
    # waiters after a reconnect) and takes the freed lock.
    server = redis_factory()
    holder = await make_client(server.url, watchdog_ttl=30.0, op_timeout=0.5)
    other = await make_client(server.url, watchdog_ttl=30.0, op_timeout=0.5)
    lease = await holder.lock("freed", on_lost="ignore").acquire()
    waiting = asyncio.create_task(other.lock("freed").acquire(timeout=HANG))
    hub = backend_of(other).hub
    await eventually(lambda: hub.channels() != [] and all(map(hub.is_ready, hub.channels())))
    await asyncio.to_thread(server.restart)
    second = await asyncio.wait_for(waiting, HANG)
    assert second.token == 1  # the counter was lost with the data
    assert second.owner != lease.owner
    # The holder finds out at its next renewal, or at its release (on_lost="ignore": the
    # release returns, the lease is marked lost).
    await holder.lock("freed").release()
    assert lease.lost


@pytest.mark.slow
async def test_a_waiter_rides_out_a_paused_server(
    redis_factory: Any, make_client: ClientFactory, raw_factory: RawFactory
) -> None:
    # The holder's fixed lease (0.6 s) ends while the server is paused (1.5 s): the waiter
    # wakes for it, its attempts time out (op_timeout 0.3 s) and are tried again, and once
    # the server answers it gets the lock.  A first attempt would have raised at once.
    server = redis_factory()
    holder = await make_client(server.url, op_timeout=0.3)
    other = await make_client(server.url, op_timeout=0.3, watchdog_ttl=10.0)
    lease = await holder.lock("stalled", ttl=0.6, on_lost="ignore").acquire()
    async with Monitor(raw_factory(server.url)) as monitor:
        port = port_of(backend_of(other).link)
        waiting = asyncio.create_task(other.lock("stalled").acquire(timeout=HANG))

        async def asleep() -> bool:
            await monitor.sync()
            return monitor.scripts(port) >= 2

        await eventually(asleep, what="waiter asleep")
    await asyncio.to_thread(server.pause)
    try:
        await asyncio.sleep(1.5)
        assert not waiting.done(), waiting.exception() if waiting.done() else None
    finally:
        await asyncio.to_thread(server.resume)
    second = await asyncio.wait_for(waiting, HANG)
    assert second.token == lease.token + 1


@pytest.mark.slow
async def test_paused_server_gives_backend_errors_and_recovers(
    redis_factory: Any, make_client: ClientFactory, raw_factory: RawFactory
) -> None:
    server = redis_factory()
    op_timeout = 0.4
    client = await make_client(server.url, op_timeout=op_timeout, watchdog_ttl=30)
    other = await make_client(server.url, op_timeout=op_timeout)
    held = client.lock("paused")
    await held.acquire()
    async with Monitor(raw_factory(server.url)) as monitor:
        port = port_of(backend_of(other).link)
        waiting = asyncio.create_task(other.lock("paused").acquire(timeout=HANG))

        # asleep: one attempt, the subscription, one more attempt, and (once it has waited
        # URGENT_AFTER) its attempt as an urgent waiter, which takes a place in line
        async def asleep() -> bool:
            await monitor.sync()
            return monitor.scripts(port) == 3

        await eventually(asleep, what="waiter asleep")
    await asyncio.to_thread(server.pause)
    try:
        for call in (
            lambda: client.lock("paused:other").acquire(timeout=1),
            lambda: client.status("paused"),
            lambda: held.extend(),
            lambda: client.force_release("nothing"),
        ):
            started = time.monotonic()
            with pytest.raises(aiodlock.BackendError):
                await call()
            # one round trip (op_timeout), plus the cleanup of an interrupted acquire
            assert time.monotonic() - started < 3 * op_timeout + 1.0
        started = time.monotonic()
        with pytest.raises(aiodlock.BackendError):
            await held.release()
        assert time.monotonic() - started < 4 * op_timeout + 1.0
    finally:
        await asyncio.to_thread(server.resume)
    # The same clients work again without a restart.  The holder's release was lost, so
    # the lock is still held: the waiter still waits, and a force_release wakes it.
    assert not waiting.done()
    assert await client.force_release("paused")
    lease = await asyncio.wait_for(waiting, HANG)
    assert lease.token >= 2
    async with client.lock("paused", timeout=HANG) as again:  # the waiter's task ended
        assert again.token > lease.token


@pytest.mark.slow
async def test_a_silent_pubsub_connection_is_noticed_by_its_ping_and_replaced(
    redis_factory: Any, make_client: ClientFactory, raw_factory: RawFactory
) -> None:
    # A paused server keeps its TCP connections open: only the hub's PING, sent when the
    # connection has been quiet for ping_interval (1 s here) and unanswered within
    # op_timeout, tells that it went silent.  The hub then reconnects once the server is
    # back, and the waiter is still woken by the next release.
    server = redis_factory()
    holder = await make_client(server.url, op_timeout=5.0)
    waiter = await make_client(
        server.url, op_timeout=0.3, watchdog_ttl=3.0, client_name="quiet-waiter"
    )
    raw = raw_factory(server.url)
    hub = backend_of(waiter).hub
    await holder.lock("quiet").acquire()
    waiting = asyncio.create_task(waiter.lock("quiet").acquire(timeout=HANG))
    first: list[int] = []

    async def subscribed() -> bool:  # on its first pub/sub connection
        first[:] = await connection_ids(raw, "quiet-waiter", "pubsub")
        return hub.channels() != [] and len(first) == 1

    await eventually(subscribed, what="subscribed")
    await asyncio.sleep(0.2)
    await asyncio.to_thread(server.pause)
    try:
        # ping_interval (1 s) + op_timeout (0.3 s): the hub gives the connection up
        await eventually(lambda: not hub.connected.is_set(), what="the hub noticed", timeout=5)
    finally:
        await asyncio.to_thread(server.resume)

    async def reconnected() -> bool:  # on another connection
        now = await connection_ids(raw, "quiet-waiter", "pubsub")
        return hub.connected.is_set() and len(now) == 1 and now != first

    await eventually(reconnected, what="reconnected")
    assert not waiting.done()
    await holder.lock("quiet").release()
    lease = await asyncio.wait_for(waiting, HANG)
    assert lease.token == 2


@pytest.mark.slow
async def test_paused_server_while_holding_loses_the_lease_on_time(
    redis_factory: Any, make_client: ClientFactory
) -> None:
    server = redis_factory()
    client = await make_client(server.url, op_timeout=0.3, watchdog_ttl=1.2)
    async with client.lock("pause-hold", on_lost="ignore") as lease:
        await asyncio.to_thread(server.pause)
        try:
            started = time.monotonic()
            async with asyncio.timeout(HANG):
                await lease.wait_lost()
            assert time.monotonic() - started <= 1.2 + 0.5
        finally:
            await asyncio.to_thread(server.resume)


async def _cancel_after(coro: Any, iterations: int) -> Any:
    task = asyncio.ensure_future(coro)
    for _ in range(iterations):
        await asyncio.sleep(0)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


@pytest.mark.parametrize("fair", [False, True])
async def test_cancellation_anywhere_in_acquire_leaves_no_key(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str, fair: bool
) -> None:
    client = await make_client()
    other = await make_client()
    name = "cancel-fair" if fair else "cancel"
    outcomes = set()
    for iterations in range(16):
        lease = await _cancel_after(client.lock(name, fair=fair).acquire(), iterations)
        outcomes.add(lease is not None)
        if lease is not None:  # it completed before the cancellation: release it
            await _release_in_owner_task(client, name, fair)
        assert await keys_of(raw, namespace) == [], iterations
        got = await other.lock(name, fair=fair).try_acquire()
        assert got is not None, iterations
        await other.lock(name, fair=fair).release()
    assert False in outcomes  # some cancellations did interrupt the acquire


async def _release_in_owner_task(client: aiodlock.Client, name: str, fair: bool) -> None:
    # The lease belongs to the cancelled task, which has ended: the core releases orphans.
    async def freed() -> bool:
        return await client.status(name) is None

    await eventually(freed, what="orphan released")
    del fair


async def test_cancelled_waiter_leaves_no_key_and_no_subscription(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    holder = await make_client()
    client = await make_client()
    for fair in (False, True):
        name = f"cw-{fair}"
        await holder.lock(name, fair=fair).acquire()
        for iterations in (0, 1, 2, 3, 5, 8, 13, 40, 200):
            await _cancel_after(client.lock(name, fair=fair).acquire(), iterations)
            assert backend_of(client).hub.channels() == []
            assert await raw.exists(f"{namespace}:{{{name}}}:line") == 0
        await holder.lock(name, fair=fair).release()
    assert await keys_of(raw, namespace) == []


async def test_cancellation_anywhere_in_release_leaves_no_key(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    client = await make_client()
    lock = client.lock("cancel-release")
    for iterations in range(12):

        async def hold_and_release() -> None:
            await lock.acquire()
            await asyncio.sleep(0)
            await lock.release()

        task = asyncio.create_task(hold_and_release())
        for _ in range(iterations + 3):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

        async def gone() -> bool:
            return await keys_of(raw, namespace) == []

        await eventually(gone, what=f"released after a cancel at step {iterations}")


@pytest.mark.slow
async def test_ten_thousand_leases_renewed_by_pipelined_batches(
    make_client: ClientFactory, raw_factory: RawFactory
) -> None:
    ttl = 6.0
    client = await make_client(watchdog_ttl=ttl, op_timeout=10)
    backend = backend_of(client)
    calls: list[int] = []
    original = backend.renew

    async def counting_renew(grants: Any, ttl_: float) -> Any:
        calls.append(len(grants))
        return await original(grants, ttl_)

    backend.renew = counting_renew  # type: ignore[method-assign]
    holders = 50
    per_holder = 200
    release = asyncio.Event()
    leases: list[aiodlock.Lease] = []

    async def holder(index: int) -> None:
        for j in range(per_holder):
            leases.append(await client.lock(f"bulk:{index}:{j}").acquire())
        await release.wait()
        for j in range(per_holder):
            await client.lock(f"bulk:{index}:{j}").release()

    tasks = [asyncio.create_task(holder(i)) for i in range(holders)]
    await eventually(lambda: len(leases) == holders * per_holder, timeout=120, what="all held")
    all_held = time.monotonic()
    tasks_alive = len(asyncio.all_tasks())
    with writes(backend.link) as sent:
        # One full renewal round: every lease renewed once.
        await eventually(lambda: sum(calls) >= holders * per_holder, timeout=ttl * 3)
    elapsed = time.monotonic() - all_held
    assert not any(lease.lost for lease in leases)
    assert len(calls) <= 60, calls  # batches, not 10,000 calls
    assert len(sent) <= len(calls) + 5
    assert tasks_alive <= holders + 20  # no task per lease
    assert elapsed < ttl * 3
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
