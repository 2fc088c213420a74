"""Smoke test of ``python -m benchmarks.opcodes``: it counts a cycle's bytecodes and locks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from benchmarks import opcodes
from tests.servers import RedisGroup

pytestmark = pytest.mark.redis


async def test_counts_the_cycles_and_frees_the_lock(
    redis_many: Callable[..., RedisGroup],
) -> None:
    one = redis_many(1)
    counts = await opcodes.count("redis://" + one.hosts, 20, warm_up=5)
    per_cycle = sum(counts.values()) / 20
    # A cycle runs the core and the backend (hundreds of bytecodes at the least).
    assert per_cycle > 500
    assert any(file == "_client.py" and name == "acquire" for file, name, _ in counts)
    text = opcodes.report(counts, 20, 5)
    assert text.startswith("opcodes per cycle:")
    server = next(iter(one))
    raw = aioredis.Redis(host=server.host, port=server.port)
    try:
        assert not await raw.exists("aiodlock:{opcodes}")  # released at the end
        assert int(await raw.get("aiodlock:{opcodes}:token") or 0) == 25  # 5 + 20 grants
    finally:
        await raw.aclose()
