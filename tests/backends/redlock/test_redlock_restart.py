"""A node restarted without persistence, and the ``rejoin_delay`` procedure that guards it.

The hazard (Redlock paper, "Performance, crash-recovery and fsync"): a holder has 3 of 5
nodes, one of them restarts empty, and another client now finds 3 free nodes.  With
``rejoin_delay`` a node that lost its data (its marker key is gone) is not counted until
that long after it was first seen empty, which outlasts every lease it forgot.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

import aiodlock
from tests.servers import RedisGroup

from .redlock_helpers import HANG, ClientFactory, backend_of

pytestmark = pytest.mark.redis


def marker(namespace: str) -> bytes:
    return f"{namespace}:redlock:rejoin".encode()


@pytest.mark.slow
async def test_restarted_node_breaks_exclusion_unless_its_rejoin_is_delayed(
    make_client: ClientFactory, five: RedisGroup, raw: list[aioredis.Redis], namespace: str
) -> None:
    ttl = 2.0
    rejoin = ttl + 0.5  # the documented rule: at least the longest lease in use
    for r in raw:
        # The documented step for a fresh deployment: trust its (empty) nodes at once.
        await r.set(marker(namespace), 0)
    holder = await make_client(rejoin_delay=rejoin)
    five[3].kill()
    five[4].kill()
    lease = await holder.lock("restart", ttl=ttl, on_lost="ignore").acquire(timeout=HANG)
    # The holder has nodes 0, 1, 2.  Node 2 restarts (no persistence: it comes back empty),
    # and nodes 3 and 4 come back (empty too).
    five[2].restart()
    five[3].start()
    five[4].start()

    # Without the procedure: a client that counts every node gets 2, 3, 4 while the holder's
    # lease is still valid.  Mutual exclusion is broken, and the token did not increase.
    unsafe = await make_client()
    intruder = await unsafe.lock("restart", ttl=0.5).try_acquire()
    assert intruder is not None
    assert lease.expires_in is not None
    assert lease.expires_in > 0
    assert intruder.token <= lease.token
    await unsafe.lock("restart").release()

    # With rejoin_delay, nodes 2, 3 and 4 do not count until the delay has passed.
    safe = await make_client(rejoin_delay=rejoin)
    nodes = backend_of(safe).nodes
    assert [n.counts(time.monotonic()) for n in nodes] == [True, True, False, False, False]
    assert await safe.lock("restart").try_acquire() is None
    with pytest.raises(aiodlock.LockTimeout):
        await safe.lock("restart").acquire(timeout=0.5)
    got = await safe.lock("restart").acquire(timeout=HANG)
    assert lease.expires_in == 0.0  # granted only once the holder's lease had ended
    assert lease.lost
    assert got.token > lease.token
    await safe.lock("restart").release()


@pytest.mark.slow
async def test_fresh_nodes_count_only_after_the_rejoin_delay(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    client = await make_client(rejoin_delay=1.0)
    started = time.monotonic()
    # Nothing tells a fresh node from one that just lost its data: both wait.
    assert await client.lock("fresh").try_acquire() is None
    lease = await client.lock("fresh").acquire(timeout=HANG)
    assert time.monotonic() - started >= 0.5
    await client.lock("fresh").release()
    for r in raw:
        assert await r.get(marker(namespace)) is not None
    # Markers survive: a new client trusts the nodes at once.
    again = await make_client(rejoin_delay=1.0)
    assert await again.lock("fresh").try_acquire() is not None
    await again.lock("fresh").release()
    assert lease.token >= 1


async def test_nodes_with_a_marker_count_at_once(
    make_client: ClientFactory, raw: list[aioredis.Redis], namespace: str
) -> None:
    for r in raw:
        await r.set(marker(namespace), 0)
    client = await make_client(rejoin_delay=30)
    async with client.lock("seeded", timeout=0) as lease:
        assert lease.token >= 1
