"""Smoke test of ``python -m benchmarks.instructions``: its measured loops run and lock.

(The valgrind wrapper itself is not run here: it takes minutes.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from benchmarks import instructions
from tests.servers import RedisGroup

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("variant", instructions.VARIANTS)
async def test_each_measured_loop_takes_and_frees_the_lock(
    redis_many: Callable[..., RedisGroup], variant: str
) -> None:
    five = redis_many(5)
    url = "redlock://" + five.hosts
    await instructions._child(url, variant, 25)
    suffix = {"lib": "", "backend": "-backend", "bare": "-bare"}[variant]
    counter = f"aiodlock:{{instructions{suffix}}}:token"
    tokens = []
    for server in five:
        raw = aioredis.Redis(host=server.host, port=server.port)
        try:
            tokens.append(int(await raw.get(counter) or 0))
            left = await raw.keys("aiodlock:*")
        finally:
            await raw.aclose()
        assert all(key.endswith(b":token") for key in left), left  # every lock released
    # Every cycle was granted by a majority: a majority of the counters counts every cycle.
    assert sorted(tokens)[len(tokens) // 2] >= 25
