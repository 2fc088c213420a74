"""examples/fastapi_app.py and examples/aiohttp_app.py end to end, over HTTP.

Each app runs as users run it (uvicorn, or the aiohttp script), twice, in two processes on the
same ``AIODLOCK_URL``, so the tests see the lock work across processes, not only across the
tasks of one server.  The work endpoints answer with the lease's token and when the work
started and finished (``time.time()``: one clock for every process of the host).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import aiodlock
from tests.helpers import HANG, eventually
from tests.servers import free_port

from .conftest import BACKENDS, EXAMPLES, backend_url, example_env

#: how each app is started, as its docstring tells users
COMMANDS = {
    "fastapi": lambda port: [
        sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLES), "fastapi_app:app",
        "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
    ],
    "aiohttp": lambda port: [sys.executable, str(EXAMPLES / "aiohttp_app.py"), "--port", str(port)],
}  # fmt: skip

#: the fast suite runs each framework and each backend once; the whole suite, every pair
FAST = {("fastapi", "redis"), ("aiohttp", "sqlite")}
APPS = [
    pytest.param(
        (framework, b.values[0]),
        id=f"{framework}-{b.id}",
        marks=[*b.marks, *([] if (framework, b.values[0]) in FAST else [pytest.mark.slow])],
    )
    for framework, b in itertools.product(COMMANDS, BACKENDS)
]


class WebApp:
    """One process of an example app on a free port."""

    def __init__(self, framework: str, url: str, log: Path) -> None:
        self.framework = framework
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                COMMANDS[framework](self.port),
                env=example_env(url),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + HANG
        while True:
            assert self.proc.poll() is None, f"the app ended: {self.log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{self.base_url}/resources/-/lock", timeout=1).is_success:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready: {self.log.read_text()[-3000:]}"
            time.sleep(0.05)

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL if it lingers.  Did it stop cleanly (its lifespan or cleanup
        context closed the client)?"""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(HANG)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait()
        if self.framework == "fastapi":  # (uvicorn re-raises the signal once it has shut down)
            return "Application shutdown complete." in self.log.read_text()
        return code == 0


class Apps:
    def __init__(self, url: str, apps: list[WebApp]) -> None:
        self.url = url  # AIODLOCK_URL of the apps (its namespace included)
        self.apps = apps

    def base(self, n: int) -> str:
        """The base URL of app ``n`` (modulo the number of apps: requests spread over them)."""
        return self.apps[n % len(self.apps)].base_url


@pytest.fixture(scope="module", params=APPS)
def apps(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Apps]:
    framework, backend = request.param
    directory = tmp_path_factory.mktemp(f"{framework}-{backend}")
    # (a short lease, renewed every 1/3 s, so that a broken lock is noticed soon)
    url = backend_url(backend, request, directory) + "&watchdog_ttl=1"
    started = [WebApp(framework, url, directory / f"app{n}.log") for n in range(2)]
    try:
        for app in started:
            app.wait_ready()
        yield Apps(url, started)
    finally:
        stopped = [app.stop() for app in started]
    assert all(stopped), [app.log.read_text()[-3000:] for app in started]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=HANG) as client:
        yield client


def resource() -> str:
    return f"r{time.monotonic_ns()}"


def assert_busy(response: httpx.Response) -> None:
    """The documented answer to a busy resource: 409, Retry-After in seconds, a detail."""
    assert response.status_code == 409, response.text
    assert response.headers["Retry-After"] == "1"
    assert response.json() == {"detail": "the resource is busy, try again later"}


def assert_one_at_a_time(bodies: list[dict[str, Any]]) -> None:
    """No two works on one resource overlapped; tokens increase in the order they started."""
    bodies = sorted(bodies, key=lambda b: b["started"])
    for body, after in itertools.pairwise(bodies):
        assert body["finished"] <= after["started"], f"overlap: {body} and {after}"
    tokens = [b["token"] for b in bodies]
    assert tokens == sorted(set(tokens)), tokens


async def test_busy_resource_answers_409_with_retry_after(
    apps: Apps, http: httpx.AsyncClient
) -> None:
    busy, free = resource(), resource()
    async with aiodlock.connect(apps.url) as client, client.lock(f"resource:{busy}") as lease:
        # Somebody (here: the test) holds the resource: both processes see it held...
        for n in range(2):
            status = (await http.get(f"{apps.base(n)}/resources/{busy}/lock")).json()
            assert status["held"] is True
            assert status["token"] == lease.token
            assert status["owner"] == lease.owner
        # ...and every request for it, in the handler or through the dependency, is a 409.
        paths = [f"/resources/{busy}/work", f"/resources/{busy}/report"]
        requests = [http.post(apps.base(n) + path) for n in range(6) for path in paths]
        # (waiting is allowed, but not for ever)
        requests.append(http.post(f"{apps.base(0)}/resources/{busy}/work?wait=0.2"))
        for response in await asyncio.gather(*requests):
            assert_busy(response)
        # Another resource is not in the way.
        for n, path in enumerate(("work", "report")):
            response = await http.post(f"{apps.base(n)}/resources/{free}/{path}?seconds=0")
            assert response.status_code == 200, response.text
            assert response.json()["resource"] == free
    # Released: the resource is free again.
    response = await http.post(f"{apps.base(1)}/resources/{busy}/report?seconds=0")
    assert response.status_code == 200, response.text
    assert response.json()["token"] > lease.token
    assert (await http.get(f"{apps.base(0)}/resources/{busy}/lock")).json() == {"held": False}


async def test_one_request_at_a_time_inside(apps: Apps, http: httpx.AsyncClient) -> None:
    rid = resource()
    # Requests that wait for the lock: every one gets in, one at a time, across both apps.
    waiting = [
        http.post(f"{apps.base(n)}/resources/{rid}/work?seconds=0.02&wait={HANG}") for n in range(8)
    ]
    responses = await asyncio.gather(*waiting)
    assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]
    bodies = [r.json() for r in responses]
    assert len({b["pid"] for b in bodies}) == 2
    assert_one_at_a_time(bodies)

    # Try-locks (handler and dependency) at once: each gets in alone or is told it is busy.
    paths = ["work?seconds=0.1", "report?seconds=0.1"]
    trying = [
        http.post(f"{apps.base(n)}/resources/{rid}/{path}") for n in range(4) for path in paths
    ]
    responses = await asyncio.gather(*trying)
    inside = [r.json() for r in responses if r.status_code == 200]
    for response in responses:
        if response.status_code != 200:
            assert_busy(response)
    assert inside, "somebody got in"
    assert_one_at_a_time(inside + bodies)


async def test_different_resources_run_at_the_same_time(
    apps: Apps, http: httpx.AsyncClient
) -> None:
    a, b = resource(), resource()
    responses = await asyncio.gather(
        http.post(f"{apps.base(0)}/resources/{a}/work?seconds=0.3"),
        http.post(f"{apps.base(0)}/resources/{b}/report?seconds=0.3"),
        http.post(f"{apps.base(1)}/resources/{a}x/report?seconds=0.3"),
    )
    assert [r.status_code for r in responses] == [200] * 3, [r.text for r in responses]
    bodies = [r.json() for r in responses]
    # Each started before any finished: all three were inside their locks at once.
    assert max(b["started"] for b in bodies) < min(b["finished"] for b in bodies), bodies


async def test_a_lost_lease_stops_the_work_with_503(apps: Apps, http: httpx.AsyncClient) -> None:
    rids = resource(), resource()
    # Work that would outlast the test (httpx gives up after HANG seconds)...
    running = [
        asyncio.ensure_future(http.post(f"{apps.base(0)}/resources/{rids[0]}/work?seconds=60")),
        asyncio.ensure_future(http.post(f"{apps.base(1)}/resources/{rids[1]}/report?seconds=60")),
    ]

    async def held() -> bool:
        answers = [await http.get(f"{apps.base(0)}/resources/{rid}/lock") for rid in rids]
        return all(a.json()["held"] for a in answers)

    await eventually(held, what="both works running")
    # ...until an admin breaks the locks: the apps notice at their next renewal.
    async with aiodlock.connect(apps.url) as client:
        for rid in rids:
            await client.force_release(f"resource:{rid}")
    for response in await asyncio.gather(*running):
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "1"
        assert response.json() == {
            "detail": "the lock was lost while working; the work was stopped"
        }
