"""memory:// frees what it no longer needs: a private space with its client, a name's state
when the name is released (measured with tracemalloc: what stays allocated afterwards)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Awaitable, Callable

import aiodlock
import aiodlock.testing


async def _growth(step: Callable[[int], Awaitable[None]], warm: int, measured: int) -> int:
    """Bytes still allocated after ``measured`` steps (each followed by a loop turn, in which
    asyncio drops the cancelled timers of released leases)."""
    for i in range(warm):
        await step(i)
        await asyncio.sleep(0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(warm, warm + measured):
            await step(i)
            await asyncio.sleep(0)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def test_a_private_space_goes_with_its_client() -> None:
    async def one_client(_: int) -> None:
        async with aiodlock.testing.memory_client() as client, client.lock("job") as lease:
            assert lease.token == 1  # a space of its own

    grown = await _growth(one_client, warm=100, measured=800)
    # (a space kept per client was ~700 bytes each: 560 kB here)
    assert grown < 200_000, grown


async def test_released_names_keep_no_state() -> None:
    async with aiodlock.testing.memory_client() as client:
        last = [0]

        async def one_name(i: int) -> None:
            async with client.lock(f"name-{i}") as lease:
                assert lease.token > last[0]  # one counter: still strictly increasing
                last[0] = lease.token

        grown = await _growth(one_name, warm=100, measured=10_000)
        # (a counter kept per name was ~150 bytes each: 1.5 MB here)
        assert grown < 200_000, grown


async def test_a_private_client_that_reopens_keeps_its_tokens_increasing() -> None:
    client = aiodlock.testing.memory_client()
    async with client, client.lock("job") as first:
        pass
    async with client, client.lock("job") as second:
        assert second.token > first.token
