"""Same-process hand-off: a release hands a non-fair lock straight to a local waiter.

The core chooses the receiver, delivers and settles (``aiodlock._local``); the Redis backend
offers the one-round-trip step (``RedisBackend.transfer``, the RELEASE_TRANSFER script).
The tests that drive one step at a time use the client's table of waiting owners directly.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock._local import LocalWaiters
from aiodlock._types import Busy, Grant, Request, monotonic
from aiodlock.backends.redis import RedisBackend
from aiodlock.backends.redis._scripts import RELEASE_TRANSFER

from .redis_helpers import HANG, ClientFactory, Monitor, backend_of, eventually, port_of

pytestmark = pytest.mark.redis


def _lock_key(namespace: str, name: str) -> bytes:
    return f"{namespace}:{{{name}}}".encode()


async def _script_calls(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def _local(client: aiodlock.Client) -> LocalWaiters:
    """The client's table of its waiting owners (the core's hand-off)."""
    local: LocalWaiters = client._local
    return local


def _idle_waiter(client: aiodlock.Client, name: str) -> bool:
    """A local non-fair waiter of ``name`` is registered and not asking the server now."""
    return _local(client).receiver(name, "") is not None


class _Holder:
    """A task that acquires a lock and keeps it until told (a task that ends releases)."""

    def __init__(self, lock: aiodlock.Lock, timeout: float) -> None:
        self.lease: asyncio.Future[aiodlock.Lease] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run(lock, timeout))

    async def _run(self, lock: aiodlock.Lock, timeout: float) -> None:
        try:
            lease = await lock.acquire(timeout=timeout)
        except BaseException as exc:
            self.lease.set_exception(exc)
            raise
        self.lease.set_result(lease)
        await self.stop.wait()
        await lock.release()

    async def result(self) -> aiodlock.Lease:
        return await asyncio.wait_for(asyncio.shield(self.lease), HANG)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, HANG)


async def _release(local: LocalWaiters, grant: Grant) -> bool:
    return await local.start_release(grant, False)


async def _fair_waiters(client: aiodlock.Client, name: str, count: int) -> bool:
    status = await client.status(name)
    return status is not None and status.waiters == count


async def _hold(backend: RedisBackend, name: str, owner: str) -> Grant:
    got = await backend.try_acquire(Request(name, owner, 30.0), will_wait=False)
    assert isinstance(got, Grant)
    return got


async def test_a_same_process_handoff_is_one_round_trip(
    client: aiodlock.Client, raw: aioredis.Redis, namespace: str
) -> None:
    backend = backend_of(client)
    holder = await client.lock("one-trip").acquire()
    waiting = _Holder(client.lock("one-trip"), HANG)
    await eventually(lambda: _idle_waiter(client, "one-trip"), what="a local waiter")
    calls = await _script_calls(raw)
    async with Monitor(raw) as monitor:
        port = port_of(backend.link)
        await client.lock("one-trip").release()
        lease = await waiting.result()
        await monitor.sync()
    # The release script handed it over; the woken waiter took it without asking again.
    assert monitor.scripts(port) == 1
    assert await _script_calls(raw) - calls == 1
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) == 1
    assert lease.token == holder.token + 1
    assert await raw.hgetall(_lock_key(namespace, "one-trip")) == {
        lease.owner.encode(): str(lease.token).encode()
    }
    pttl = await raw.pttl(_lock_key(namespace, "one-trip"))
    assert 0 < pttl <= 30_000
    await waiting.finish()
    assert await raw.exists(_lock_key(namespace, "one-trip")) == 0


async def test_a_waiter_leaving_with_an_untaken_handoff_releases_it(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    # The acquire loop's deadline case: the hand-off lands, the waiter leaves without
    # another attempt.  Its exit must give the lock back.
    client = await make_client()
    other = await make_client()
    backend = backend_of(client)
    local = _local(client)
    grant = await _hold(backend, "untaken", "me:1")
    request = Request("untaken", "me:2", 30.0)
    async with backend.waiter(request) as waiter:
        entry = local.join(request, waiter)
        assert await local.start_release(grant, False) is True
        assert entry.delivered is not None
        assert entry.delivered.token == grant.token + 1
        assert (await raw.hgetall(_lock_key(namespace, "untaken"))) == {
            b"me:2": str(grant.token + 1).encode()
        }
        local.leave(entry)
        await local.settle(entry)
    assert await raw.exists(_lock_key(namespace, "untaken")) == 0
    lease = await other.lock("untaken").try_acquire()
    assert lease is not None
    assert lease.token == grant.token + 2


async def test_a_waiter_leaving_while_the_handoff_is_in_flight_releases_it(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str, monkeypatch: Any
) -> None:
    client = await make_client()
    other = await make_client()
    backend = backend_of(client)
    node = backend
    grant = await _hold(backend, "in-flight", "me:1")
    sent = asyncio.Event()
    go_on = asyncio.Event()
    original = node.transfer

    async def slow(*args: Any, **kwargs: Any) -> Any:
        sent.set()
        await go_on.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(node, "transfer", slow)
    request = Request("in-flight", "me:2", 30.0)
    local = _local(client)
    async with Monitor(raw) as monitor:
        async with backend.waiter(request) as waiter:
            entry = local.join(request, waiter)
            releasing = asyncio.create_task(_release(local, grant))
            await asyncio.wait_for(sent.wait(), HANG)
            # Leave now: settling waits for the answer, then gives the delivered lock back.
            asyncio.get_running_loop().call_soon(go_on.set)
            local.leave(entry)
            await local.settle(entry)
        assert await asyncio.wait_for(releasing, HANG) is True
        await monitor.sync()
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) == 1
    assert await raw.exists(_lock_key(namespace, "in-flight")) == 0
    assert await other.lock("in-flight").try_acquire() is not None


async def test_a_waiter_cancelled_right_after_the_handoff_leaves_no_lock(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str, monkeypatch: Any
) -> None:
    client = await make_client()
    other = await make_client()
    backend = backend_of(client)
    node = backend
    await client.lock("cancelled").acquire()
    waiting = asyncio.create_task(client.lock("cancelled").acquire(timeout=HANG))
    await eventually(lambda: _idle_waiter(client, "cancelled"), what="a local waiter")
    original = node.transfer

    async def then_cancel(*args: Any, **kwargs: Any) -> Any:
        value = await original(*args, **kwargs)
        waiting.cancel()  # lands before the waiter can take the grant
        return value

    monkeypatch.setattr(node, "transfer", then_cancel)
    async with Monitor(raw) as monitor:
        await client.lock("cancelled").release()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, HANG)
        await monitor.sync()
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) == 1
    assert await raw.exists(_lock_key(namespace, "cancelled")) == 0
    assert await other.lock("cancelled").try_acquire() is not None


async def test_a_deadline_during_the_handoff_ends_with_one_clear_holder(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str, monkeypatch: Any
) -> None:
    # Through the public API: the hand-off answer comes only after the waiter's deadline.
    # The waiter's last attempt waits for that answer (asking the server meanwhile could
    # not tell), so it ends holding the lock, and it is the only holder.
    client = await make_client()
    other = await make_client()
    backend = backend_of(client)
    node = backend
    await client.lock("late").acquire()
    waiting = _Holder(client.lock("late"), 0.5)
    await eventually(lambda: _idle_waiter(client, "late"), what="a local waiter")
    original = node.transfer

    async def late(*args: Any, **kwargs: Any) -> Any:
        value = await original(*args, **kwargs)
        await asyncio.sleep(0.7)  # past the waiter's deadline
        return value

    monkeypatch.setattr(node, "transfer", late)
    async with Monitor(raw) as monitor:
        await client.lock("late").release()
        lease = await waiting.result()
        await monitor.sync()
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) == 1
    assert await raw.hgetall(_lock_key(namespace, "late")) == {
        lease.owner.encode(): str(lease.token).encode()
    }
    assert await other.lock("late").try_acquire() is None
    await waiting.finish()
    assert await raw.exists(_lock_key(namespace, "late")) == 0


async def test_the_waiter_takes_the_delivered_grant_without_a_round_trip(
    client: aiodlock.Client, raw: aioredis.Redis
) -> None:
    backend = backend_of(client)
    local = _local(client)
    grant = await _hold(backend, "taken", "me:1")
    request = Request("taken", "me:2", 12.0)
    async with backend.waiter(request) as waiter:
        entry = local.join(request, waiter)
        before = monotonic()
        assert await local.start_release(grant, False) is True
        trips = await _script_calls(raw)
        got = await local.attempt(entry)
        assert isinstance(got, Grant)
        assert await _script_calls(raw) == trips
        assert got.token == grant.token + 1
        assert got.owner == "me:2"
        assert got.expires_at is not None
        assert before <= got.expires_at - 12.0 <= monotonic()
        local.leave(entry)
        assert not entry.needs_settling()
    # Taken: leaving the waiter keeps it.
    status = await backend.status("taken")
    assert status is not None
    assert status.owner == "me:2"
    assert await backend.release(got) is True


async def test_release_of_a_lease_no_longer_held_hands_nothing_over(
    client: aiodlock.Client, raw: aioredis.Redis, namespace: str
) -> None:
    backend = backend_of(client)
    grant = await _hold(backend, "gone", "me:1")
    await raw.delete(_lock_key(namespace, "gone"))
    request = Request("gone", "me:2", 30.0)
    local = _local(client)
    async with backend.waiter(request) as waiter:
        entry = local.join(request, waiter)
        assert await local.start_release(grant, False) is False
        assert entry.delivered is None
        local.leave(entry)
    # nothing was handed over: no new grant counted
    assert int(await raw.get(backend.keys_for("gone").counter)) == grant.token
    assert await raw.exists(_lock_key(namespace, "gone")) == 0


async def test_a_failed_transfer_falls_back_to_a_plain_release(
    client: aiodlock.Client, raw: aioredis.Redis, namespace: str, monkeypatch: Any
) -> None:
    backend = backend_of(client)
    holder = await client.lock("fallback").acquire()

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise aiodlock.BackendError("redis: release_transfer failed: injected")

    monkeypatch.setattr(backend, "transfer", broken)
    waiting = _Holder(client.lock("fallback"), HANG)
    await eventually(lambda: _idle_waiter(client, "fallback"), what="a local waiter")
    async with Monitor(raw) as monitor:
        await client.lock("fallback").release()
        lease = await waiting.result()
        await monitor.sync()
    assert lease.token == holder.token + 1
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) == 0
    assert await raw.hget(_lock_key(namespace, "fallback"), lease.owner) is not None
    await waiting.finish()


async def test_fair_locks_keep_their_queue(client: aiodlock.Client, raw: aioredis.Redis) -> None:
    await client.lock("fair", fair=True).acquire()
    waiting = asyncio.create_task(client.lock("fair", fair=True).acquire(timeout=HANG))
    await eventually(lambda: _fair_waiters(client, "fair", 1), what="a fair waiter")
    assert _local(client).waiting("fair") == 0  # (a fair waiter is never handed a lock)
    async with Monitor(raw) as monitor:
        await client.lock("fair", fair=True).release()
        await asyncio.wait_for(waiting, HANG)
        await monitor.sync()
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) == 0


async def test_tokens_increase_and_nobody_overlaps_under_contention(
    make_client: ClientFactory, raw: aioredis.Redis
) -> None:
    clients = [await make_client(), await make_client()]
    inside = 0
    overlaps = 0
    tokens: list[int] = []

    async def worker(client: aiodlock.Client, rounds: int) -> None:
        nonlocal inside, overlaps
        for i in range(rounds):
            async with client.lock("busy", timeout=HANG) as lease:
                inside += 1
                if inside != 1:
                    overlaps += 1
                tokens.append(lease.token)
                await asyncio.sleep(0 if i % 3 else 0.001)
                inside -= 1

    workers = [worker(c, 30) for c in clients for _ in range(6)]
    async with Monitor(raw) as monitor:
        await asyncio.wait_for(asyncio.gather(*workers), HANG * 3)
        await monitor.sync()
    assert overlaps == 0
    assert len(tokens) == 12 * 30
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) > 0  # hand-offs
    for client in clients:
        assert not _local(client)


async def test_handoffs_among_tasks_of_one_client_are_one_round_trip_each(
    client: aiodlock.Client, raw: aioredis.Redis
) -> None:
    # Waiters that are asleep when the release comes get the lock in one round trip: with
    # 4 tasks each holding the lock in turn, most owner changes are hand-offs.
    backend = backend_of(client)
    tokens: list[int] = []

    async def worker() -> None:
        for _ in range(20):
            async with client.lock("turns", timeout=HANG) as lease:
                tokens.append(lease.token)
                await asyncio.sleep(0.001)

    async with Monitor(raw) as monitor:
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(4))), HANG * 3)
        await monitor.sync()
    assert all(a < b for a, b in itertools.pairwise(tokens))
    assert monitor.scripts(sha=RELEASE_TRANSFER.sha) >= 20
    assert not _local(client)
    assert await backend.status("turns") is None


async def test_abandon_after_a_handoff_deletes_only_its_own_owner(
    client: aiodlock.Client, raw: aioredis.Redis, namespace: str
) -> None:
    backend = backend_of(client)
    local = _local(client)
    grant = await _hold(backend, "abandon", "me:1")
    request = Request("abandon", "me:2", 30.0)
    async with backend.waiter(request) as waiter:
        entry = local.join(request, waiter)
        assert await local.start_release(grant, False) is True
        got = await local.attempt(entry)
        assert isinstance(got, Grant)
        local.leave(entry)
    await backend.abandon(Request("abandon", "me:3", 30.0))  # not the holder: no effect
    assert await raw.hget(_lock_key(namespace, "abandon"), "me:2") is not None
    await backend.abandon(request)
    assert await raw.exists(_lock_key(namespace, "abandon")) == 0
    busy = await backend.try_acquire(Request("abandon", "me:4", 30.0), will_wait=False)
    assert not isinstance(busy, Busy)


@pytest.mark.parametrize("fair", [False, True], ids=["non-fair", "fair"])
async def test_random_timeouts_and_cancellations_leave_nothing_behind(
    make_client: ClientFactory, fair: bool
) -> None:
    # Waiters that time out, are cancelled at random points, or get the lock, on two clients
    # at once: nobody overlaps, tokens increase, and at the end no key, no local waiter, no
    # board slot and no wanted subscription is left.
    clients = [await make_client(), await make_client()]
    rng = random.Random(1234)
    inside = 0
    overlaps = 0
    tokens: list[int] = []
    outcomes = collections.Counter[str]()

    async def attempt(client: aiodlock.Client) -> None:
        nonlocal inside, overlaps
        timeout = rng.choice([0, 0.002, 0.01, None])
        try:
            async with client.lock("chaos", timeout=timeout, fair=fair) as lease:
                inside += 1
                try:
                    if inside != 1:
                        overlaps += 1
                    tokens.append(lease.token)
                    await asyncio.sleep(rng.choice([0, 0, 0.001]))
                finally:
                    inside -= 1  # (a cancellation may end the body here)
            outcomes["held"] += 1
        except aiodlock.LockTimeout:
            outcomes["timed out"] += 1

    async def worker(client: aiodlock.Client) -> None:
        for _ in range(25):
            task = asyncio.create_task(attempt(client))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.003))
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                outcomes["cancelled"] += 1

    await asyncio.wait_for(asyncio.gather(*(worker(c) for c in clients for _ in range(5))), HANG)
    assert overlaps == 0
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    assert outcomes["held"] > 0
    assert outcomes["cancelled"] > 0
    for client in clients:
        backend = backend_of(client)
        await eventually(lambda c=client: not _local(c), what="no waiter")
        assert backend.board.names() == []
        assert backend.hub.channels() == []  # (lingering subscriptions are not wanted)
        assert await client.status("chaos") is None
    lease = await clients[0].lock("chaos", fair=fair).acquire(timeout=0)
    assert lease.token > tokens[-1]
    await clients[0].lock("chaos", fair=fair).release()
