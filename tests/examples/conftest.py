"""Fixtures for the examples' end-to-end tests: each example runs as the user runs it (its own
OS processes, ``AIODLOCK_URL`` in the environment) on SQLite (a temp file) and on Redis (the
shared server of tests/conftest.py), a fresh namespace each time."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tests.helpers import HANG, ROOT, worker_env

EXAMPLES = ROOT / "examples"

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]


def backend_url(backend: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """``AIODLOCK_URL`` for ``backend``, in a namespace of its own."""
    if backend == "sqlite":
        base = f"sqlite:///{directory / 'locks.db'}"
    else:
        base = str(request.getfixturevalue("redis_server").url)
    return f"{base}?namespace=t{uuid.uuid4().hex[:10]}"


def example_env(url: str) -> dict[str, str]:
    """The environment of an example's process: this checkout importable, ``url`` to lock on."""
    env = worker_env()
    env["AIODLOCK_URL"] = url
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(params=BACKENDS)
def example_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(str(request.param), request, tmp_path)


#: ``await run_example(script, *args, query="&option=value")``: the example's process on
#: ``example_url`` (plus ``query``), stdout piped (stderr too)
RunExample = Callable[..., Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def run_example(example_url: str, tmp_path: Path) -> AsyncIterator[RunExample]:
    """Start ``examples/<script>`` on ``example_url``; every process still running at the end
    is killed (and its stderr shown if the test failed)."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(script: str, *args: str, query: str = "") -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / script),
            *args,
            cwd=tmp_path,
            env=example_env(example_url + query),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            async with asyncio.timeout(HANG):
                await proc.wait()
