"""Waiting: pub/sub wake-ups, one shared connection, lease-end wake-ups, reconnects, fair mode."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock._types import Busy, Request
from aiodlock.backends.redis._wire import Address

from .redis_helpers import (
    HANG,
    ClientFactory,
    Monitor,
    backend_of,
    connection_ids,
    eventually,
    keys_of,
    port_of,
)

pytestmark = pytest.mark.redis


async def _pubsub_clients(raw: aioredis.Redis, name_part: str) -> int:
    clients = await raw.client_list(_type="pubsub")
    return sum(1 for c in clients if name_part in c.get("name", ""))


async def test_release_wakes_a_waiter_without_polling(
    make_client: ClientFactory, raw: aioredis.Redis
) -> None:
    a = await make_client()
    b = await make_client()
    port_b = port_of(backend_of(b).link)
    holder = await a.lock("wake").acquire()
    del holder
    async with Monitor(raw) as monitor:
        waiting = asyncio.create_task(b.lock("wake").acquire(timeout=HANG))
        await eventually(lambda: backend_of(b).hub.channels() != [], what="subscribed")
        await eventually(lambda: bool(backend_of(b).hub.is_ready(backend_of(b).hub.channels()[0])))
        await monitor.sync()
        attempts = monitor.scripts(port_b)
        await asyncio.sleep(0.3)  # a polling waiter would make attempts meanwhile
        await monitor.sync()
    assert monitor.scripts(port_b) - attempts <= 1
    released = time.monotonic()
    await a.lock("wake").release()
    lease = await asyncio.wait_for(waiting, HANG)
    assert time.monotonic() - released < 2.0  # woken by the release, not by the 30 s lease
    assert lease.token >= 2


async def test_one_pubsub_connection_for_all_waiters_and_names(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    a = await make_client()
    b = await make_client(client_name="waiters-b")
    names = [f"shared:{i}" for i in range(5)]
    for name in names:
        await a.lock(name).acquire()

    async def waiter(name: str) -> None:
        async with b.lock(name, timeout=HANG):
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(waiter(name)) for name in names for _ in range(4)]
    hub = backend_of(b).hub
    await eventually(lambda: len(hub.channels()) == 5, what="5 channels")
    await eventually(lambda: all(hub.is_ready(ch) for ch in hub.channels()), what="ready")
    first = await connection_ids(raw, "waiters-b", "pubsub")
    assert len(first) == 1
    assert len(await raw.pubsub_channels(f"{namespace}:*")) == 5
    for name in names:
        await a.lock(name).release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    # The last local waiter of each name left: unsubscribed, on the server too.
    assert hub.channels() == []
    await eventually(lambda: _no_channels(raw, namespace), what="server-side unsubscribed")
    # the same pub/sub connection all along (now subscribed to nothing)
    assert first[0] in await connection_ids(raw, "waiters-b")


async def _no_channels(raw: aioredis.Redis, namespace: str) -> bool:
    return await raw.pubsub_channels(f"{namespace}:*") == []


async def test_a_release_wakes_one_local_waiter_not_all(
    make_client: ClientFactory, raw: aioredis.Redis
) -> None:
    a = await make_client()
    b = await make_client()
    port_b = port_of(backend_of(b).link)
    await a.lock("herd").acquire()
    gate = asyncio.Event()

    async def waiter() -> None:
        async with b.lock("herd", timeout=HANG):
            await gate.wait()

    async with Monitor(raw) as monitor:
        tasks = [asyncio.create_task(waiter()) for _ in range(6)]

        # Each waiter makes two or three attempts (one; one more if it was not yet
        # subscribed when it sent the first; once it has waited URGENT_AFTER, one that takes
        # its place in line), then it sleeps: asleep once no attempt came for 0.3 s.
        seen: list[tuple[float, int]] = []

        async def asleep() -> bool:
            await monitor.sync()
            count, now = monitor.scripts(port_b), time.monotonic()
            if not seen or seen[-1][1] != count:
                seen.append((now, count))
            return count >= 12 and now - seen[-1][0] >= 0.3

        await eventually(asleep, what="all waiters asleep")
        before = monitor.scripts(port_b)
        assert 12 <= before <= 18  # (no attempt but those: nothing woke a sleeping waiter)
        await a.lock("herd").release()
        await eventually(lambda: _held_by(a, b), what="a waiter of b got it")
        await asyncio.sleep(0.2)  # give a herd the chance to show
        await monitor.sync()
    # one woken waiter, one attempt (plus, at most, one more from a lease-end wake-up)
    assert monitor.scripts(port_b) - before <= 2
    gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)


async def _held_by(observer: aiodlock.Client, b: aiodlock.Client) -> bool:
    status = await observer.status("herd")  # asked through another client: no round trip of b
    return status is not None and status.owner.startswith(b.id)


async def test_waiter_wakes_when_the_holders_lease_runs_out(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    b = await make_client()
    key = f"{namespace}:{{ghost}}"
    # A holder that died: its key stays until its lease ends, and no release message comes.
    await raw.hset(key, "dead-process:1", 1)
    await raw.pexpire(key, 400)
    started = time.monotonic()
    lease = await b.lock("ghost").acquire(timeout=HANG)
    assert time.monotonic() - started < 3.0
    assert lease.token >= 1


async def test_waiter_survives_a_pubsub_connection_drop(
    make_client: ClientFactory, raw: aioredis.Redis
) -> None:
    a = await make_client()
    b = await make_client(client_name="drop-b")
    await a.lock("drop").acquire()
    waiting = asyncio.create_task(b.lock("drop").acquire(timeout=HANG))
    hub = backend_of(b).hub
    await eventually(lambda: bool(hub.channels()) and hub.is_ready(hub.channels()[0]))
    first = await connection_ids(raw, "drop-b", "pubsub")
    killed = await raw.client_kill_filter(_type="pubsub", skipme=True)
    assert killed >= 1

    async def reconnected() -> bool:  # on a new pub/sub connection
        return await connection_ids(raw, "drop-b", "pubsub") not in ([], first)

    await eventually(reconnected, what="reconnected")
    await eventually(lambda: hub.is_ready(hub.channels()[0]), what="resubscribed")
    assert await _pubsub_clients(raw, "drop-b") == 1
    released = time.monotonic()
    await a.lock("drop").release()
    lease = await asyncio.wait_for(waiting, HANG)
    assert time.monotonic() - released < 2.0  # by the message, not the 30 s lease
    assert lease.token >= 2


@pytest.mark.slow  # (a fault: it waits out op_timeout, then polls)
async def test_waiters_poll_while_pubsub_is_unavailable(make_client: ClientFactory) -> None:
    a = await make_client()
    b = await make_client()
    backend = backend_of(b)

    async def broken() -> Address:
        raise ConnectionError("pub/sub unavailable in this test")

    backend.hub.link.address = broken
    await a.lock("poll").acquire()
    waiting = asyncio.create_task(b.lock("poll").acquire(timeout=HANG))
    await asyncio.sleep(0.05)
    released = time.monotonic()
    await a.lock("poll").release()
    lease = await asyncio.wait_for(waiting, HANG)
    # bounded by the subscription wait (op_timeout) plus the polling backoff cap
    assert time.monotonic() - released < b.config.op_timeout + 2
    assert lease.token >= 2


async def test_no_barging_inside_one_process(make_client: ClientFactory) -> None:
    client = await make_client()
    rounds = 30
    order: list[int] = []

    async def worker(index: int) -> None:
        lock = client.lock("fifo-ish")
        for _ in range(rounds):
            async with lock:
                order.append(index)
                await asyncio.sleep(0)

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(4))), HANG)
    same = sum(1 for x, y in itertools.pairwise(order) if x == y)
    # The releasing task does not take the lock straight back from its woken waiters.
    assert same / len(order) < 0.25, order
    assert sorted(order.count(i) for i in range(4)) == [rounds] * 4


async def test_try_acquire_does_not_wait_for_a_local_handoff(client: aiodlock.Client) -> None:
    backend = backend_of(client)
    lock = client.lock("try")
    await lock.acquire()
    waiting = asyncio.create_task(client.lock("try").acquire(timeout=HANG))
    await eventually(lambda: bool(backend.hub.channels()))
    await lock.release()
    lease = await asyncio.wait_for(waiting, HANG)
    assert lease.token >= 2


# -- fair mode --------------------------------------------------------------------------------


async def _queued(client: aiodlock.Client, name: str) -> int:
    status = await client.status(name)
    return 0 if status is None or status.waiters is None else status.waiters


async def test_fair_grants_in_request_order_across_clients(make_client: ClientFactory) -> None:
    holder = await make_client()
    clients = [await make_client() for _ in range(3)]
    await holder.lock("queue", fair=True).acquire()
    got: list[int] = []
    tasks = []
    for i in range(6):
        c = clients[i % 3]

        async def waiter(i: int = i, c: aiodlock.Client = c) -> None:
            async with c.lock("queue", fair=True, timeout=HANG):
                got.append(i)

        tasks.append(asyncio.create_task(waiter()))
        await eventually(lambda i=i: _queued_at_least(holder, "queue", i + 1), what=f"w{i}")
    await holder.lock("queue", fair=True).release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    assert got == list(range(6))


async def _queued_at_least(client: aiodlock.Client, name: str, n: int) -> bool:
    return await _queued(client, name) >= n


async def test_fair_try_lock_leaves_nothing_behind(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    a = await make_client()
    b = await make_client()
    async with a.lock("try-fair", fair=True):
        assert await b.lock("try-fair", fair=True).try_acquire() is None
        assert await raw.exists(f"{namespace}:{{try-fair}}:line") == 0
        assert await raw.exists(f"{namespace}:{{try-fair}}:deadlines") == 0
    assert await keys_of(raw, namespace) == []


async def test_fair_timeout_and_cancel_leave_no_queue_entry(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    a = await make_client()
    b = await make_client()
    await a.lock("leave", fair=True).acquire()
    with pytest.raises(aiodlock.LockTimeout):
        await b.lock("leave", fair=True).acquire(timeout=0.2)
    assert await raw.exists(f"{namespace}:{{leave}}:line") == 0
    task = asyncio.create_task(b.lock("leave", fair=True).acquire(timeout=HANG))
    await eventually(lambda: _queued_at_least(a, "leave", 1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await raw.exists(f"{namespace}:{{leave}}:line") == 0
    assert await raw.exists(f"{namespace}:{{leave}}:deadlines") == 0
    await a.lock("leave", fair=True).release()
    assert await keys_of(raw, namespace) == []


async def test_fair_dead_waiter_is_purged_by_its_deadline(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    a = await make_client()
    b = await make_client()
    await a.lock("purge", fair=True).acquire()
    queue = f"{namespace}:{{purge}}:line"
    deadlines = f"{namespace}:{{purge}}:deadlines"
    # A waiter at the head of the queue whose process died: it never takes its turn.
    seconds, micros = await raw.time()
    now_ms = seconds * 1000 + micros // 1000
    await raw.zadd(queue, {"dead-process:7": 0})  # (ranked first: the line is a zset)
    await raw.zadd(deadlines, {"dead-process:7": now_ms + 600})
    waiting = asyncio.create_task(b.lock("purge", fair=True).acquire(timeout=HANG))
    await eventually(lambda: _queued_at_least(a, "purge", 2))
    await a.lock("purge", fair=True).release()  # wakes the dead head only
    started = time.monotonic()
    lease = await asyncio.wait_for(waiting, HANG)
    assert time.monotonic() - started < 3.0  # at the dead waiter's deadline, not later
    assert lease.token >= 2
    assert await raw.zrange(queue, 0, -1) == []


async def test_fair_release_notifies_only_the_next_waiter(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    holder = await make_client()
    waiters = [await make_client() for _ in range(4)]
    listener = raw.pubsub()
    await listener.psubscribe(f"{namespace}:*")
    await holder.lock("next", fair=True).acquire()
    gates = [asyncio.Event() for _ in waiters]

    async def wait_then_hold(c: aiodlock.Client, gate: asyncio.Event) -> None:
        async with c.lock("next", fair=True, timeout=HANG):
            await gate.wait()

    tasks = []
    for i, c in enumerate(waiters):
        tasks.append(asyncio.create_task(wait_then_hold(c, gates[i])))
        await eventually(lambda i=i: _queued_at_least(holder, "next", i + 1))
    await holder.lock("next", fair=True).release()
    messages = []
    for gate in gates:
        await eventually(lambda: _someone_holds(holder, "next"))
        gate.set()
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    async with asyncio.timeout(HANG):
        while True:
            msg = await listener.get_message(timeout=0.5)
            if msg is None:
                break
            if msg["type"] == "pmessage":
                messages.append(msg["channel"])
    await listener.aclose()
    # 5 releases (holder + 4 waiters): one message each; each to one waiter's own channel
    # while waiters remained, then the name's channel for the last one.
    assert len(messages) == 5, messages
    assert len(set(messages[:4])) == 4
    assert all(b":released:" in m for m in messages[:4])
    assert messages[4].endswith(b":released")


async def _someone_holds(client: aiodlock.Client, name: str) -> bool:
    return await client.status(name) is not None


async def test_fair_waiter_keeps_its_place_while_it_waits(make_client: ClientFactory) -> None:
    # watchdog_ttl 0.6 s: a queued owner's place lapses after 0.6 s unless it retries
    holder = await make_client(watchdog_ttl=0.6)
    first = await make_client(watchdog_ttl=0.6)
    second = await make_client(watchdog_ttl=0.6)
    await holder.lock("keep", fair=True).acquire()
    got: list[str] = []

    async def waiter(c: aiodlock.Client, tag: str) -> None:
        async with c.lock("keep", fair=True, timeout=HANG):
            got.append(tag)

    t1 = asyncio.create_task(waiter(first, "first"))
    await eventually(lambda: _queued_at_least(holder, "keep", 1))
    t2 = asyncio.create_task(waiter(second, "second"))
    await eventually(lambda: _queued_at_least(holder, "keep", 2))
    await asyncio.sleep(1.5)  # longer than a waiter's place lasts without a retry
    await holder.lock("keep", fair=True).release()
    await asyncio.wait_for(asyncio.gather(t1, t2), HANG)
    assert got == ["first", "second"]


async def test_fair_status_counts_waiters(make_client: ClientFactory) -> None:
    a = await make_client()
    b = await make_client()
    await a.lock("count", fair=True).acquire()
    tasks = [
        asyncio.create_task(b.lock("count", fair=True).acquire(timeout=HANG)) for _ in range(3)
    ]
    await eventually(lambda: _queued_at_least(a, "count", 3))
    status = await a.status("count")
    assert status is not None
    assert status.waiters == 3
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert await _queued(a, "count") == 0


async def test_fair_request_is_queued_only_when_it_will_wait(client: aiodlock.Client) -> None:
    backend = backend_of(client)
    other = Request("fq", "x:1", 5.0, fair=True)
    assert not isinstance(await backend.try_acquire(other, will_wait=False), Busy)
    busy = await backend.try_acquire(Request("fq", "y:1", 5.0, fair=True), will_wait=True)
    assert isinstance(busy, Busy)
    assert busy.retry_after is not None
    # a queued waiter retries within a third of its place's lease (watchdog_ttl)
    assert busy.retry_after <= client.config.watchdog_ttl / 3 + 0.01
    status = await client.status("fq")
    assert status is not None
    assert status.waiters == 1
    await backend.abandon(Request("fq", "y:1", 5.0, fair=True))
    status = await client.status("fq")
    assert status is not None
    assert not status.waiters
