"""Helpers shared by the Redis backend tests."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

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


async def script_calls(raw: aioredis.Redis) -> int:
    """EVALSHA and EVAL calls the server ran so far (its commandstats)."""
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def port_of(link: Any) -> str:
    """The local port of a link's connection, as MONITOR and CLIENT LIST show its client."""
    pipe = link.pipe
    assert pipe is not None
    assert pipe.transport is not None
    return str(pipe.transport.get_extra_info("sockname")[1])


class Monitor:
    """Every command the server runs while inside (MONITOR), with the client that sent it.

    Call :meth:`sync` before reading: MONITOR reports what ran, a moment later.
    """

    def __init__(self, raw: aioredis.Redis) -> None:
        self.raw = raw
        self.commands: list[dict[str, Any]] = []

    async def __aenter__(self) -> Monitor:
        self._monitor = self.raw.monitor()
        await self._monitor.__aenter__()
        self._task = asyncio.create_task(self._collect())
        return self

    async def _collect(self) -> None:
        while True:
            self.commands.append(await self._monitor.next_command())

    async def __aexit__(self, *exc_info: object) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._monitor.__aexit__()

    async def sync(self) -> None:
        """Until everything the server ran so far was seen."""
        marker = f"monitor-sync-{uuid.uuid4().hex}"
        await self.raw.echo(marker)
        await eventually(lambda: any(marker in c["command"] for c in self.commands), timeout=HANG)

    def scripts(self, port: str | None = None, sha: str | None = None) -> int:
        """Script runs (EVALSHA, EVAL) sent by the client on ``port`` (any client: None),
        of the script with ``sha`` (any: None; an EVAL counts for every sha)."""
        count = 0
        for c in self.commands:
            if port is not None and c["client_port"] != port:
                continue
            words = c["command"].split(" ", 2)
            if words[0].upper() == "EVALSHA":
                count += sha is None or words[1] == sha
            else:  # (an EVAL, after a NOSCRIPT, counts when any script is asked for)
                count += words[0].upper() == "EVAL" and c["client_type"] != "lua" and sha is None
        return count

    def by(self, port: str) -> list[str]:
        """The commands sent by the client on ``port``, in order (their first word)."""
        return [
            c["command"].split(" ", 1)[0].upper() for c in self.commands if c["client_port"] == port
        ]


async def connection_ids(raw: aioredis.Redis, name: str, kind: str | None = None) -> list[int]:
    """The server's ids of the connections named ``name`` (CLIENT LIST; ``kind``: pubsub...)."""
    listed = await raw.client_list(_type=kind) if kind else await raw.client_list()
    return sorted(int(c["id"]) for c in listed if c.get("name") == name)


@contextlib.contextmanager
def writes(*links: Any) -> Iterator[list[bytes]]:
    """What is written on the links' current connections while inside: each write is one
    round trip (a pipeline is one write)."""
    seen: list[bytes] = []
    transports = []
    for link in links:
        assert link.pipe is not None
        transport = link.pipe.transport
        write = transport.write

        def counting(data: bytes, write: Any = write) -> None:
            seen.append(bytes(data))
            write(data)

        transport.write = counting
        transports.append(transport)
    try:
        yield seen
    finally:
        for transport in transports:
            del transport.write
