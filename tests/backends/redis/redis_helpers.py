"""Helpers shared by the Redis backend tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redis import RedisBackend

#: Generous upper bound for "this must not hang" (the machine is shared and loaded).
HANG = 20.0


class ClientFactory(Protocol):
    def __call__(self, url: str | None = None, **options: Any) -> Awaitable[aiodlock.Client]: ...


RawFactory = Callable[..., aioredis.Redis]


def backend_of(client: aiodlock.Client) -> RedisBackend:
    backend = client.backend
    assert isinstance(backend, RedisBackend)
    return backend


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = HANG, what: str = ""
) -> None:
    """Poll ``check`` until it is true (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s {what}".strip())
        await asyncio.sleep(0.01)


async def keys_of(raw: aioredis.Redis, namespace: str) -> list[bytes]:
    """Every key of a namespace (the fencing counters excluded)."""
    found = [key async for key in raw.scan_iter(match=f"{namespace}:*", count=1000)]
    return sorted(key for key in found if not key.endswith(b":token"))
