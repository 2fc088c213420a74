"""Fixtures for the Redis backend tests: clients and a raw redis client.

The shared ``redis_server`` (tests/conftest.py) serves the protocol tests; every test uses a
fresh namespace.  Fault tests take private servers from ``redis_factory``.  The Sentinel and
Cluster deployments (``sentinel_deployment``, ``cluster_deployment`` and their factories) are
in tests/conftest.py, shared with the contract suite.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.servers import RedisServer

from .redis_helpers import RawFactory


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def lock_url(redis_url: str) -> str:
    return redis_url


@pytest.fixture
async def raw_factory(redis_url: str) -> AsyncIterator[RawFactory]:
    """``raw_factory(url=None)``: a plain redis.asyncio client, to look at keys directly."""
    made: list[aioredis.Redis] = []

    def make(url: str | None = None) -> aioredis.Redis:
        raw = aioredis.Redis.from_url(url or redis_url)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        with contextlib.suppress(Exception):
            await raw.aclose()


@pytest.fixture
def raw(raw_factory: RawFactory) -> aioredis.Redis:
    return raw_factory()
