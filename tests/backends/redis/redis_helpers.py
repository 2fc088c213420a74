"""Helpers shared by the Redis backend tests."""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redis import RedisBackend
from tests.helpers import HANG as HANG
from tests.helpers import ClientFactory as ClientFactory
from tests.helpers import eventually as eventually

RawFactory = Callable[..., aioredis.Redis]


def backend_of(client: aiodlock.Client) -> RedisBackend:
    backend = client.backend
    assert isinstance(backend, RedisBackend)
    return backend


async def keys_of(raw: aioredis.Redis, namespace: str) -> list[bytes]:
    """Every key of a namespace (the fencing counters excluded)."""
    found = [key async for key in raw.scan_iter(match=f"{namespace}:*", count=1000)]
    return sorted(key for key in found if not key.endswith(b":token"))
