"""Redlock under faults: nodes killed, paused, restarted; several OS processes."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redis._scripts import LockKeys
from tests.helpers import read_cycles, worker_command, worker_env
from tests.servers import RedisGroup

from .redlock_helpers import (
    HANG,
    ClientFactory,
    backend_of,
    eventually,
    holders,
    keys_per_node,
    no_keys_left,
)

pytestmark = pytest.mark.redis


@pytest.mark.slow
async def test_several_processes_exclude_each_other_and_tokens_increase(
    url: str, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    rounds = 15
    procs = [
        await asyncio.create_subprocess_exec(
            *worker_command(
                "cycles", url, "procs", str(rounds), str(log), f"namespace={namespace}"
            ),
            stdout=subprocess.PIPE,
            env=worker_env(),
        )
        for _ in range(4)
    ]
    await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 90)
    for proc in procs:
        assert proc.returncode == 0
    cycles = read_cycles(log)
    assert not [c for c in cycles if c.state == "OVERLAP"]
    rows = [(c.entered, c.left, c.token) for c in cycles]
    assert len(rows) == 4 * rounds
    for (_, left, token), (entered, _, next_token) in itertools.pairwise(rows):
        assert left <= entered  # one holder at a time
        assert next_token > token  # fencing tokens increase in holding order


@pytest.mark.slow
async def test_two_of_five_killed_locks_still_work(
    make_client: ClientFactory, five: RedisGroup, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client()
    b = await make_client()
    five[1].kill()
    five[3].kill()
    keys = LockKeys(namespace, "two-down")
    alive = [raw[0], raw[2], raw[4]]
    async with a.lock("two-down") as lease:
        found = await holders(alive, keys.lock)
        assert found == [{lease.owner.encode(): str(lease.token).encode()}] * 3
        assert await b.lock("two-down").try_acquire() is None
    inside = 0
    peak = 0

    async def worker(c: aiodlock.Client) -> None:
        nonlocal inside, peak
        for _ in range(5):
            async with c.lock("two-down"):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.002)
                inside -= 1

    async with asyncio.timeout(HANG * 3):
        await asyncio.gather(*(worker(c) for c in (a, b) for _ in range(2)))
    assert peak == 1
    assert await keys_per_node(alive, namespace) == [[]] * 3


@pytest.mark.slow
async def test_three_of_five_killed_never_grants(
    make_client: ClientFactory, five: RedisGroup
) -> None:
    a = await make_client()
    for i in (0, 2, 4):
        five[i].kill()
    started = time.monotonic()
    with pytest.raises((aiodlock.LockTimeout, aiodlock.BackendError)):
        await a.lock("three-down").acquire(timeout=1.0)
    assert time.monotonic() - started < 1.0 + 5.0
    with pytest.raises(aiodlock.BackendError, match="no majority"):
        await a.lock("three-down").try_acquire()
    with pytest.raises(aiodlock.BackendError):
        await a.status("three-down")
    # back to a majority: it works again
    five[2].start()
    async with a.lock("three-down", timeout=HANG) as lease:
        assert lease.token >= 1


@pytest.mark.slow
async def test_a_waiter_rides_out_a_lost_majority(
    make_client: ClientFactory, five: RedisGroup
) -> None:
    # Three of five nodes die while a waiter waits for a fixed lease (0.8 s) to end: its
    # attempts then fail ("no majority"), and it tries again until they are back (a first
    # attempt would raise at once, as the test above shows).
    holder = await make_client()
    waiter = await make_client(watchdog_ttl=10.0)
    await holder.lock("comeback", ttl=0.8, on_lost="ignore").acquire()
    waiting = asyncio.create_task(waiter.lock("comeback").acquire(timeout=HANG))
    # asleep: a release message or the lease's end wakes it
    await eventually(lambda: bool(backend_of(waiter).board.names()), what="waiter registered")
    for i in (0, 2, 4):
        five[i].kill()
    await asyncio.sleep(1.5)  # the lease ended; the waiter's attempts fail meanwhile
    assert not waiting.done(), waiting.exception() if waiting.done() else None
    for i in (0, 2, 4):
        five[i].start()
    lease = await asyncio.wait_for(waiting, HANG)
    assert lease.owner.startswith(waiter.id)  # granted to the waiter once the nodes were back
    # (its token may be 1 again: the three nodes came back without their data, and a
    # majority of them grants with fresh counters; docs/backends/redlock.md, Fencing tokens)
    assert lease.token >= 1


@pytest.mark.slow
async def test_a_paused_node_does_not_block_acquisition(
    make_client: ClientFactory, five: RedisGroup, raw: list[aioredis.Redis], namespace: str
) -> None:
    node_timeout = 0.1
    a = await make_client(node_timeout=node_timeout, op_timeout=5.0)
    b = await make_client(node_timeout=node_timeout, op_timeout=5.0)
    five[4].pause()
    try:
        started = time.monotonic()
        lease = await a.lock("paused").acquire(timeout=HANG)
        took = time.monotonic() - started
        # about node_timeout (the paused node's answer is not awaited longer), far below
        # op_timeout; generous for a loaded machine
        assert took < node_timeout + 1.5, took
        assert lease.expires_in is not None
        assert lease.expires_in > 29

        async def take_turn() -> int:
            async with b.lock("paused", timeout=HANG) as got:
                return got.token

        waiting = asyncio.create_task(take_turn())
        await eventually(lambda: bool(backend_of(b).board.names()), what="waiter registered")
        started = time.monotonic()
        await a.lock("paused").release()
        assert time.monotonic() - started < 3.0  # the release does not wait for op_timeout
        assert await asyncio.wait_for(waiting, HANG) > lease.token
    finally:
        five[4].resume()
    found = await keys_per_node(raw[:4], namespace)
    assert found == [[]] * 4


@pytest.mark.slow
async def test_holder_losing_its_majority_is_told_and_cancelled(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client(watchdog_ttl=1.2)
    keys = LockKeys(namespace, "majority")
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def body() -> None:
        async with a.lock("majority"):
            entered.set()
            try:
                await asyncio.sleep(HANG)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), HANG)
    for r in raw[:3]:  # three nodes forget the lock (an eviction, a FLUSHALL...)
        await r.delete(keys.lock)
    started = time.monotonic()
    with pytest.raises(aiodlock.LockLost):
        await asyncio.wait_for(task, HANG)
    assert cancelled.is_set()
    assert time.monotonic() - started < 1.2 + 2.0  # at the next renewal


@pytest.mark.slow
async def test_holder_losing_its_nodes_loses_the_lease_at_its_end(
    make_client: ClientFactory, five: RedisGroup
) -> None:
    ttl = 1.5
    a = await make_client(watchdog_ttl=ttl)
    entered = asyncio.Event()

    async def body() -> aiodlock.Lease:
        async with a.lock("killed") as lease:
            entered.set()
            await asyncio.sleep(HANG)
        return lease

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), HANG)
    for i in (0, 1, 2):
        five[i].kill()
    started = time.monotonic()
    with pytest.raises(aiodlock.LockLost):
        await asyncio.wait_for(task, HANG)
    # renewals fail (no majority can answer); the lease is lost when its validity ends
    assert time.monotonic() - started < ttl + 3.0


@pytest.mark.slow
async def test_dead_nodes_do_not_strand_a_waiter(
    make_client: ClientFactory, five: RedisGroup
) -> None:
    a = await make_client()
    b = await make_client(retry_delay=5.0)
    await a.lock("strand").acquire()
    waiting = asyncio.create_task(b.lock("strand").acquire(timeout=HANG))
    await eventually(lambda: bool(backend_of(b).board.names()), what="waiter registered")
    five[0].kill()
    five[1].kill()
    started = time.monotonic()
    await a.lock("strand").release()
    lease = await asyncio.wait_for(waiting, HANG)
    assert time.monotonic() - started < 3.0  # the release messages of the live nodes
    assert lease.token >= 2


@pytest.mark.slow
async def test_cancelled_acquire_with_paused_nodes_leaves_no_keys(
    make_client: ClientFactory, five: RedisGroup, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client(node_timeout=0.5)
    paused = (2, 3, 4)
    for i in paused:
        five[i].pause()
    try:
        task = asyncio.create_task(a.lock("cancel-paused").acquire())
        # Nodes 0 and 1 granted; the three paused ones keep the fan-out waiting.
        await eventually(lambda: _held_on(raw[:2], namespace), what="grants on nodes 0 and 1")
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        found = await keys_per_node(raw[:2], namespace)
        assert found == [[]] * 2  # undone at once where the nodes answer
    finally:
        for i in paused:
            five[i].resume()
    # The paused nodes run the attempt and then its clean-up, in that order (one connection
    # per node): nothing is left behind anywhere.
    await no_keys_left(raw, namespace, timeout=10.0, what="keys left on the resumed nodes")
    assert await a.lock("cancel-paused").try_acquire() is not None
    await a.lock("cancel-paused").release()


async def _held_on(raws: list[aioredis.Redis], namespace: str) -> bool:
    return all(keys for keys in await keys_per_node(raws, namespace))
