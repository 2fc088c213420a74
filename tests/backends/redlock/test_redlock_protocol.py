"""The Redlock protocol on five healthy masters: keys on every node, tokens, clean-up."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redis._scripts import LockKeys

from .redlock_helpers import (
    HANG,
    ClientFactory,
    backend_of,
    eventually,
    held_everywhere,
    holders,
    keys_per_node,
    no_keys_left,
)

pytestmark = pytest.mark.redis


async def test_grant_is_on_every_node_and_release_removes_it(
    client: aiodlock.Client, raw: list[aioredis.Redis], namespace: str
) -> None:
    keys = LockKeys(namespace, "orders:42")
    async with client.lock("orders:42") as lease:
        await held_everywhere(raw, keys.lock, lease.owner, lease.token)
        for r in raw:
            pttl = await r.pttl(keys.lock)
            assert 25_000 < pttl <= 30_000
        # validity = ttl - drift (30 s * 0.01 + 2 ms), measured from before the first request
        assert lease.expires_in is not None
        assert 29.0 < lease.expires_in <= 30.0 - 0.302
        status = await client.status("orders:42")
        assert status is not None
        assert (status.owner, status.token) == (lease.owner, lease.token)
        assert status.expires_in is not None
        assert 25 < status.expires_in <= 30
    await no_keys_left(raw, namespace)
    assert await client.status("orders:42") is None


async def test_token_is_the_largest_counter_and_lagging_counters_catch_up(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client()
    b = await make_client()
    keys = LockKeys(namespace, "fence")
    # NOTE: the token is the largest counter among the nodes whose grants made the
    # majority, and an acquire decides as soon as a majority granted: which nodes those
    # are is decided here, so the test does not depend on which node answers first.
    # Nodes 1 and 2 are held by somebody else, so the majority is exactly {0, 3, 4}.
    for r in raw[1:3]:
        await r.hset(keys.lock, "other", 1)
        await r.pexpire(keys.lock, 60_000)
    await raw[0].set(keys.counter, 100)  # node 0 has seen many more grants than the others
    async with a.lock("fence") as first:
        assert first.token == 101
        # the lagging counters of the granting majority were raised before the grant
        counters = [int(await r.get(keys.counter) or 0) for r in raw]
        assert counters == [101, 0, 0, 101, 101], counters
    for r in raw[1:3]:
        await r.delete(keys.lock)
    # Every later majority shares a node with {0, 3, 4}: its token is larger, whichever
    # nodes grant it (nodes 1 and 2 are still at 0).
    async with b.lock("fence") as second:
        assert second.token > first.token
    tokens = []
    for i in range(6):
        async with (a if i % 2 else b).lock("fence") as lease:
            tokens.append(lease.token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)
    assert tokens[0] > second.token


async def test_status_needs_a_majority_of_one_owner(
    client: aiodlock.Client, raw: list[aioredis.Redis], namespace: str
) -> None:
    keys = LockKeys(namespace, "st")
    for r in raw[:2]:
        await r.hset(keys.lock, "someone", 7)
        await r.pexpire(keys.lock, 10_000)
    assert await client.status("st") is None  # two of five: nobody holds it
    await raw[2].hset(keys.lock, "someone", 9)
    await raw[2].pexpire(keys.lock, 5_000)
    status = await client.status("st")
    assert status is not None
    assert (status.owner, status.token) == ("someone", 9)
    assert status.expires_in is not None
    assert 0 < status.expires_in <= 5  # the third-longest key decides
    assert await client.force_release("st")
    assert await keys_per_node(raw, namespace) == [[]] * 5
    assert not await client.force_release("st")


async def test_failed_acquire_leaves_no_partial_keys(
    client: aiodlock.Client, raw: list[aioredis.Redis], namespace: str
) -> None:
    keys = LockKeys(namespace, "partial")
    for r in raw[:3]:  # somebody else holds a majority
        await r.hset(keys.lock, "other", 1)
        await r.pexpire(keys.lock, 60_000)
    lock = client.lock("partial")
    assert await lock.try_acquire() is None
    with pytest.raises(aiodlock.LockTimeout):
        await lock.acquire(timeout=0.3)
    found = await holders(raw, keys.lock)
    assert found[:3] == [{b"other": b"1"}] * 3
    assert found[3:] == [{}, {}]  # granted there, then undone
    # A split vote: two other owners hold 2 + 1 nodes, we would get only 2.
    await raw[2].delete(keys.lock)
    await raw[2].hset(keys.lock, "third", 1)
    await raw[2].pexpire(keys.lock, 60_000)
    assert await lock.try_acquire() is None
    with pytest.raises(aiodlock.LockTimeout):
        await lock.acquire(timeout=0.5)
    found = await holders(raw, keys.lock)
    assert found == [{b"other": b"1"}] * 2 + [{b"third": b"1"}, {}, {}]


@pytest.mark.parametrize("spins", [0, 1, 2, 3, 4, 6, 10, 20])
async def test_cancelled_in_the_middle_of_the_fan_out_leaves_no_keys(
    client: aiodlock.Client, raw: list[aioredis.Redis], namespace: str, spins: int
) -> None:
    task = asyncio.create_task(client.lock("cancel").acquire())
    for _ in range(spins):
        await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    # Either the cancellation won (clean-up) or the grant did (the finished task's hold is
    # released by the client): in both cases every node ends up empty.
    await no_keys_left(raw, namespace, what="keys left behind after a cancelled acquire")
    assert await client.lock("cancel").try_acquire() is not None
    await client.lock("cancel").release()


async def test_waiter_is_woken_by_the_release_message(make_client: ClientFactory) -> None:
    # retry_delay=10: the waiter would poll only every 5-10 s, so a prompt wake-up is the
    # release message (pub/sub on the nodes).
    holder = await make_client()
    waiter = await make_client(retry_delay=10)
    lock = holder.lock("wake")
    await lock.acquire()
    got: list[float] = []

    async def wait_turn() -> None:
        async with waiter.lock("wake", timeout=HANG):
            got.append(time.monotonic())

    task = asyncio.create_task(wait_turn())
    await eventually(lambda: bool(backend_of(waiter).board.names()), what="waiter registered")
    await asyncio.sleep(0.1)
    released = time.monotonic()
    await lock.release()
    await asyncio.wait_for(task, HANG)
    assert got[0] - released < 3.0  # well below the 5 s minimum poll


async def test_lost_release_message_does_not_strand_a_waiter(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    holder = await make_client()
    waiter = await make_client(retry_delay=0.3)
    await holder.lock("lost-msg", on_lost="ignore").acquire()
    task = asyncio.create_task(waiter.lock("lost-msg").acquire(timeout=HANG))
    await eventually(lambda: bool(backend_of(waiter).board.names()), what="waiter registered")
    keys = LockKeys(namespace, "lost-msg")
    started = time.monotonic()
    for r in raw:  # the lock vanishes without any message (an admin DEL, say)
        await r.delete(keys.lock)
    lease = await asyncio.wait_for(task, HANG)
    assert time.monotonic() - started < 5.0  # random polling every 0.15-0.3 s found it
    assert lease.token >= 1


async def test_local_tasks_take_turns_without_overlap(client: aiodlock.Client) -> None:
    inside = 0
    entries: list[int] = []
    tokens: list[int] = []

    async def worker(index: int) -> None:
        nonlocal inside
        for _ in range(10):
            async with client.lock("turns") as lease:
                inside += 1
                assert inside == 1
                entries.append(index)
                tokens.append(lease.token)
                await asyncio.sleep(0)
                inside -= 1

    async with asyncio.timeout(HANG * 3):
        await asyncio.gather(*(worker(i) for i in range(8)))
    assert len(entries) == 80
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 80


async def test_many_clients_and_tasks_exclude_each_other(make_client: ClientFactory) -> None:
    clients = [await make_client() for _ in range(3)]
    inside = 0
    peak = 0
    count = 0

    async def worker(c: aiodlock.Client) -> None:
        nonlocal inside, peak, count
        for _ in range(6):
            async with c.lock("many"):
                inside += 1
                peak = max(peak, inside)
                count += 1
                await asyncio.sleep(0.002)
                inside -= 1

    async with asyncio.timeout(HANG * 3):
        await asyncio.gather(*(worker(c) for c in clients for _ in range(4)))
    assert peak == 1
    assert count == 3 * 4 * 6


@pytest.mark.slow
async def test_watchdog_renews_on_every_node(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client(watchdog_ttl=0.9)
    keys = LockKeys(namespace, "dog")
    async with a.lock("dog") as lease:
        await asyncio.sleep(2.0)  # more than two lease lengths
        assert not lease.lost, lease.lost_reason
        for r in raw:
            assert await r.hget(keys.lock, lease.owner) == str(lease.token).encode()
        assert lease.expires_in is not None
        assert 0 < lease.expires_in <= 0.9


async def test_fixed_ttl_validity_and_expiry(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client()
    b = await make_client()
    lease = await a.lock("ttl", ttl=1.0, on_lost="ignore").acquire()
    assert lease.expires_in is not None
    assert lease.expires_in <= 1.0 - 0.012  # drift: 1 s * 0.01 + 2 ms
    got = await b.lock("ttl").acquire(timeout=HANG)
    assert lease.lost  # the fixed ttl ran out before b could take it
    assert got.token > lease.token
    await b.lock("ttl").release()
    await no_keys_left(raw, namespace)


async def test_force_release_is_a_loss_for_the_holder(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    a = await make_client(watchdog_ttl=0.9)
    admin = await make_client()
    with pytest.raises(aiodlock.LockLost):
        async with a.lock("victim"):
            assert await admin.force_release("victim")
            await asyncio.sleep(HANG)
    await no_keys_left(raw, namespace)


async def _script_calls(raw: list[aioredis.Redis]) -> int:
    """How many scripts the nodes ran (EVAL/EVALSHA of any client)."""
    calls = 0
    for r in raw:
        stats = await r.info("commandstats")
        calls += sum(
            int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha")
        )
    return calls


async def test_a_name_held_by_another_task_of_the_client_is_not_asked_for(
    client: aiodlock.Client, raw: list[aioredis.Redis]
) -> None:
    """Local turns: while a task of this client holds the name, the client's other tasks are
    answered here, also on their very first attempt: no fan-out to the masters."""
    async with client.lock("here"):
        before = await _script_calls(raw)
        # (other tasks: the holding task itself would re-enter)
        assert await asyncio.create_task(client.lock("here").try_acquire()) is None
        with pytest.raises(aiodlock.LockTimeout):
            await asyncio.create_task(client.lock("here", timeout=0.3).acquire())
        assert await _script_calls(raw) == before


# -- the line of urgent waiters (no process starves another) -------------------------------


async def test_an_urgent_waiter_has_one_rank_on_every_node_and_leaves_with_its_grant(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    holder = await make_client()
    waiter = await make_client()
    keys = LockKeys(namespace, "line")
    await holder.lock("line").acquire()
    granted: asyncio.Future[aiodlock.Lease] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def wait_then_hold() -> None:
        async with waiter.lock("line", timeout=HANG) as lease:
            granted.set_result(lease)
            await done.wait()

    task = asyncio.create_task(wait_then_hold())

    async def in_every_line() -> bool:
        lines = [await r.zrange(keys.queue, 0, -1, withscores=True) for r in raw]
        return all(len(line) == 1 for line in lines) and len({line[0] for line in lines}) == 1

    # (after URGENT_AFTER of waiting, its attempts take a place in every node's line, ranked
    # by when it began to wait: the same rank everywhere, so every node puts it in one order)
    await eventually(in_every_line, what="the waiter's place on every node")
    (member, rank), *_ = await raw[0].zrange(keys.queue, 0, -1, withscores=True)
    assert member.startswith(b"!")
    assert abs(rank / 1e6 - time.time()) < 30
    await holder.lock("line").release()
    lease = await asyncio.wait_for(granted, HANG)
    assert member == b"!" + lease.owner.encode()
    for r in raw:
        # (the nodes that granted dropped the place with the grant, the others are told to)
        await eventually(lambda r=r: _no_line(r, keys), what="a place left in line")
    done.set()
    await asyncio.wait_for(task, HANG)
    await no_keys_left(raw, namespace)


async def _no_line(r: aioredis.Redis, keys: LockKeys) -> bool:
    return not await r.exists(keys.queue) and not await r.exists(keys.deadlines)


async def test_a_waiter_ranked_ahead_of_the_first_in_line_takes_a_free_lock_at_once(
    raw: list[aioredis.Redis], namespace: str
) -> None:
    # A waiter that began to wait earlier, but joins the line only now (another task of its
    # process held the name meanwhile), must not wait behind the one a release has called.
    from aiodlock.backends.redis._scripts import ACQUIRE_FAIR

    keys = LockKeys(namespace, "rank")
    r = raw[0]

    async def attempt(owner: str, rank: int) -> int:
        args = (owner, 30_000, 30_000, 1, 1, rank)
        return int(await r.eval(ACQUIRE_FAIR.source, 4, *keys.every, *args))  # type: ignore[misc]

    await r.hset(keys.lock, "holder", 1)
    assert await attempt("late", 2_000) < 0  # held: takes its place
    await r.delete(keys.lock)  # released: "late" is the first in line, called
    assert await attempt("early", 1_000) >= 1  # ranked ahead: granted at once
    assert await r.hgetall(keys.lock) == {b"early": b"1"}
    assert await r.zrange(keys.queue, 0, -1) == [b"!late"]
