"""The per-node pipelined connections: reconnects, NOSCRIPT, a stuck node, big batches."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redis._quorum import Expiries
from aiodlock.backends.redis._scripts import LockKeys
from tests.servers import RedisGroup

from .redlock_helpers import (
    HANG,
    ClientFactory,
    backend_of,
    eventually,
    held_everywhere,
    holders,
    keys_per_node,
    no_keys_left,
    port_of,
)

pytestmark = pytest.mark.redis


async def test_a_restarted_node_is_reconnected(
    client: aiodlock.Client, five: RedisGroup, raw: list[aioredis.Redis], namespace: str
) -> None:
    async with client.lock("re") as first:
        pass
    link = backend_of(client).nodes[0].link
    # NOTE: open() and the lock need only a majority: on a loaded machine node 0's first
    # connection may still be on its way here (its requests wait for it).
    await eventually(lambda: _connected(link), what="node 0's first connection")
    port = port_of(link)
    five[0].restart()
    await eventually(lambda: _answers(raw[0]), what="node 0 back")
    async with client.lock("re", timeout=HANG) as second:
        await eventually(lambda: _holds(raw[0], namespace, second.owner), what="key on node 0")
    assert port_of(link) != port  # a new connection, to the restarted server
    assert await _listed(raw[0], port_of(link))
    assert second.token > first.token
    # NOTE: a release returns once a majority released; the fresh node 0 is often the last
    # to answer, so its key may still be there for a fraction of a millisecond.
    await no_keys_left(raw, namespace, what="every node's keys gone after the release")


def _connected(link: Any) -> bool:
    return link.pipe is not None and link.pipe.broken is None


async def _listed(r: aioredis.Redis, port: str) -> bool:
    """The server lists a client connected from ``port`` (CLIENT LIST)."""
    return any(c["addr"].rsplit(":", 1)[1] == port for c in await r.client_list())


async def _answers(r: aioredis.Redis) -> bool:
    try:
        return bool(await r.ping())
    except (OSError, aioredis.RedisError):
        return False


async def _holds(r: aioredis.Redis, namespace: str, owner: str) -> bool:
    return owner.encode() in await r.hgetall(LockKeys(namespace, "re").lock)


async def test_scripts_flushed_from_the_servers_are_sent_again(
    client: aiodlock.Client, raw: list[aioredis.Redis], namespace: str
) -> None:
    async with client.lock("flush"):
        pass
    for r in raw:
        await r.script_flush()
    async with client.lock("flush") as lease:  # NOSCRIPT -> EVAL with the source
        await held_everywhere(raw, LockKeys(namespace, "flush").lock, lease.owner, lease.token)
        assert await client.status("flush") is not None
    await no_keys_left(raw, namespace)


@pytest.mark.slow
async def test_a_stuck_node_gets_a_new_connection_after_op_timeout(
    make_client: ClientFactory, five: RedisGroup, raw: list[aioredis.Redis], namespace: str
) -> None:
    c = await make_client(op_timeout=0.5, connect_timeout=0.5)
    link = backend_of(c).nodes[4].link
    await eventually(lambda: _connected(link), what="node 4's first connection")
    port = port_of(link)
    five[4].pause()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # requests pile up on the stuck connection
            async with c.lock("stuck", timeout=HANG):
                pass
            await asyncio.sleep(0.05)
    finally:
        five[4].resume()

    async def node_4_is_used_again() -> bool:
        async with c.lock("stuck", timeout=HANG) as lease:
            found = await holders(raw[4:], LockKeys(namespace, "stuck").lock)
            return found == [{lease.owner.encode(): str(lease.token).encode()}]

    await eventually(node_4_is_used_again, what="node 4 back in use")
    assert port_of(link) != port  # the stuck connection was replaced
    assert await _listed(raw[4], port_of(link))
    await no_keys_left(raw, namespace, what="keys left on node 4")


@pytest.mark.slow
async def test_many_leases_are_renewed_in_batches(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    c = await make_client(watchdog_ttl=1.0)
    n = 200
    ready = asyncio.Event()
    done = asyncio.Event()
    leases: list[aiodlock.Lease] = []

    async def hold(i: int) -> None:
        async with c.lock(f"many:{i}") as lease:
            leases.append(lease)
            if len(leases) == n:
                ready.set()
            await done.wait()

    tasks = [asyncio.create_task(hold(i)) for i in range(n)]
    await asyncio.wait_for(ready.wait(), HANG)
    await asyncio.sleep(2.5)  # more than two lease lengths: several renewal batches
    assert not [lease for lease in leases if lease.lost]
    assert sum(len(keys) for keys in await keys_per_node(raw, namespace)) == 5 * n
    done.set()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    await no_keys_left(raw, namespace)


async def test_fan_outs_share_one_loop_timer_per_timeout(client: aiodlock.Client) -> None:
    # Each acquire and release waits for the nodes at most a timeout; the waits of one
    # timeout share ONE loop timer (re-armed when it fires) instead of one timer each.
    loop = asyncio.get_running_loop()
    armed: list[object] = []
    call_at = loop.call_at

    def counting(when: float, callback: object, *args: object, **kwargs: object) -> object:
        timer = getattr(callback, "__self__", None)  # (a fan-out queue's Timer)
        if isinstance(getattr(getattr(timer, "due", None), "__self__", None), Expiries):
            armed.append(callback)
        return call_at(when, callback, *args, **kwargs)  # type: ignore[arg-type]

    lock = client.lock("timers")
    await lock.acquire()  # (connections made, scripts loaded)
    await lock.release()
    loop.call_at = counting  # type: ignore[method-assign,assignment]
    try:
        started = time.monotonic()
        cycles = 300
        for _ in range(cycles):
            await lock.acquire()
            await lock.release()
        elapsed = time.monotonic() - started
    finally:
        del loop.call_at  # type: ignore[method-assign]
    node_timeout = backend_of(client).node_timeout(client.config.watchdog_ttl)
    # At most one timer per node_timeout window for the acquires and one per op_timeout
    # for the releases (plus one each to start), not 2 x 300.
    assert len(armed) <= elapsed / node_timeout + elapsed / client.config.op_timeout + 4
    assert len(armed) < cycles / 2
    queues = backend_of(client).fan.queues
    assert all(len(queue.entries) <= 2 for queue in queues.values())
