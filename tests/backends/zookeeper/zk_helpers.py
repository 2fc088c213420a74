"""Helpers shared by the ZooKeeper backend tests."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiozk
from aiozk import exc

import aiodlock
from aiodlock.backends.zookeeper import ZooKeeperBackend
from tests.helpers import HANG as HANG
from tests.helpers import ClientFactory as ClientFactory
from tests.helpers import eventually as eventually

RawFactory = Callable[[str], Awaitable[aiozk.ZKClient]]


WORKER = Path(__file__).with_name("zk_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def backend_of(client: aiodlock.Client) -> ZooKeeperBackend:
    backend = client.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


async def children(raw: aiozk.ZKClient, path: str) -> list[str]:
    """The children of ``path`` ([] when it does not exist)."""
    try:
        names: list[str] = await raw.get_children(path)
    except exc.NoNode:
        return []
    return names


async def queue_length(client: aiodlock.Client, raw: aiozk.ZKClient, name: str) -> int:
    return len(await children(raw, backend_of(client).lock_path(name)))


async def start_worker(*args: str) -> asyncio.subprocess.Process:
    """Run tests/backends/zookeeper/zk_worker.py in another Python process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


async def read_line(proc: asyncio.subprocess.Process, timeout: float = HANG) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(timeout):
        line = await proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        err = await proc.stderr.read()
        raise AssertionError(f"worker ended early: {err.decode(errors='replace')[-2000:]}")
    return line.decode().strip()


def options_query(**options: Any) -> str:
    return "&".join(f"{k}={v}" for k, v in options.items())
