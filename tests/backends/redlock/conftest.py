"""Fixtures for the Redlock backend tests: five independent Redis masters per test.

The masters come from ``redis_many`` (tests/conftest.py): private servers on loopback
ports that a test may kill, pause (SIGSTOP) and restart; all are closed at teardown.
Every test uses a fresh namespace; ``raw`` gives a plain redis.asyncio client per node to
look at the keys directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from tests.servers import RedisGroup

NODES = 5


@pytest.fixture
def five(redis_many: Callable[..., RedisGroup]) -> RedisGroup:
    """Five independent Redis masters (private to the test)."""
    return redis_many(NODES)


@pytest.fixture
def url(five: RedisGroup) -> str:
    return "redlock://" + five.hosts


@pytest.fixture
def lock_url(url: str) -> str:
    return url


@pytest.fixture
async def raw(five: RedisGroup) -> AsyncIterator[list[aioredis.Redis]]:
    """A plain redis.asyncio client per node (URL order), to look at keys directly."""
    made = [
        aioredis.Redis(host=s.host, port=s.port, socket_timeout=2.0, socket_connect_timeout=2.0)
        for s in five
    ]
    yield made
    for r in made:
        with contextlib.suppress(Exception):
            await r.aclose()
