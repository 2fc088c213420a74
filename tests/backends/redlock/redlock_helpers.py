"""Helpers shared by the Redlock backend tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

import aiodlock
from aiodlock.backends.redis import RedlockBackend
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


async def no_keys_left(
    raws: Sequence[aioredis.Redis], namespace: str, *, timeout: float = HANG, what: str = ""
) -> None:
    """Wait until no node holds a key of ``namespace`` (fencing counters aside).

    A release (and an acquire) returns once a MAJORITY answered: the slower nodes' requests
    are still on their way for a moment, so a look at every node right after it may see
    their keys.  This waits for them, and fails after ``timeout``.
    """

    async def empty() -> bool:
        return await keys_per_node(raws, namespace) == [[]] * len(raws)

    await eventually(empty, timeout=timeout, what=what or "keys left on a node")


async def held_everywhere(
    raws: Sequence[aioredis.Redis], key: bytes, owner: str, token: int
) -> None:
    """Wait until every node holds ``key`` for ``owner`` with ``token`` (see no_keys_left)."""
    expected = {owner.encode(): str(token).encode()}

    async def held() -> bool:
        return await holders(raws, key) == [expected] * len(raws)

    await eventually(held, what=f"{key!r} held by {owner} on every node")


def port_of(link: Any) -> str:
    """The local port of a link's connection, as CLIENT LIST shows its client."""
    pipe = link.pipe
    assert pipe is not None
    assert pipe.transport is not None
    return str(pipe.transport.get_extra_info("sockname")[1])
