"""Helpers shared by the Redlock backend tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redlock import RedlockBackend
from tests.helpers import HANG as HANG
from tests.helpers import ClientFactory as ClientFactory
from tests.helpers import eventually as eventually


def backend_of(client: aiodlock.Client) -> RedlockBackend:
    backend = client.backend
    assert isinstance(backend, RedlockBackend)
    return backend


async def keys_of(raw: aioredis.Redis, namespace: str) -> list[bytes]:
    """Every key of a namespace on one node (fencing counters and the rejoin marker excluded)."""
    found = [key async for key in raw.scan_iter(match=f"{namespace}:*", count=1000)]
    return sorted(
        key for key in found if not key.endswith(b":token") and not key.endswith(b":rejoin")
    )


async def keys_per_node(raws: Sequence[aioredis.Redis], namespace: str) -> list[list[bytes]]:
    """:func:`keys_of` on every node (a node that does not answer shows as ``None``)."""
    out: list[Any] = []
    for raw in raws:
        try:
            out.append(await asyncio.wait_for(keys_of(raw, namespace), 2.0))
        except (OSError, TimeoutError, aioredis.RedisError):
            out.append(None)
    return out


async def holders(raws: Sequence[aioredis.Redis], key: bytes) -> list[dict[bytes, bytes] | None]:
    """The lock hash ``{owner: token}`` on every node (``None`` for a node that fails)."""
    out: list[dict[bytes, bytes] | None] = []
    for raw in raws:
        try:
            out.append(await asyncio.wait_for(raw.hgetall(key), 2.0))
        except (OSError, TimeoutError, aioredis.RedisError):
            out.append(None)
    return out
