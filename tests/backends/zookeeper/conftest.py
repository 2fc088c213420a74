"""Fixtures for the ZooKeeper backend tests (real servers from tests/conftest.py).

* ``make_client(url=None, **options)``: an open aiodlock client (shared server by default),
  in a fresh namespace per test, closed at teardown;
* ``raw(hosts)``: a separate plain aiozk client, to look at the nodes directly;
* ``fast_container_server``: a private standalone server whose container reaper runs every
  100 ms (a JVM property, so it needs its own command line);
* ``logged_server``: a private standalone server that logs every request it processes
  (session, type, path: :meth:`RequestLogZooKeeper.requests`), for tests that count what
  a client sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiozk
import pytest

from tests.conftest import require_server
from tests.servers import ZooKeeperServer

from .zk_helpers import RawFactory, RequestLogZooKeeper

pytestmark = pytest.mark.zookeeper

Z = TypeVar("Z", bound=ZooKeeperServer)


@pytest.fixture
def zk_url(zookeeper_server: ZooKeeperServer) -> str:
    return zookeeper_server.url


@pytest.fixture
def lock_url(zk_url: str) -> str:
    return zk_url


@pytest.fixture
def client_options(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "session_timeout": 4.0}


@pytest.fixture
async def raw() -> AsyncIterator[RawFactory]:
    """``await raw("127.0.0.1:port,...")``: a plain aiozk client (closed at teardown)."""
    clients: list[aiozk.ZKClient] = []

    async def make(hosts: str) -> aiozk.ZKClient:
        client = aiozk.ZKClient(hosts, session_timeout=10)
        await client.start()
        clients.append(client)
        return client

    yield make
    for client in clients:
        try:
            async with asyncio.timeout(5):
                await client.close()
        except Exception:
            session = client.session
            if session.repair_loop_task is not None:
                session.repair_loop_task.cancel()
            if session.heartbeat_handle is not None:
                session.heartbeat_handle.cancel()
            if session.conn is not None and session.conn.writer is not None:
                session.conn.writer.close()


class FastContainerZooKeeper(ZooKeeperServer):
    """A standalone server that deletes empty container nodes within ~100 ms."""

    def _command(self) -> list[str]:
        command = super()._command()
        command.insert(1, "-Dznode.container.checkIntervalMs=100")
        return command


def _private(server: Z) -> Iterator[Z]:
    """Start ``server`` for one test; close it afterwards."""
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def fast_container_server(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    require_server("zookeeper")
    yield from _private(FastContainerZooKeeper(tmp_path))


@pytest.fixture
def logged_server(tmp_path: Path) -> Iterator[RequestLogZooKeeper]:
    require_server("zookeeper")
    yield from _private(RequestLogZooKeeper(tmp_path))


@pytest.fixture
def zk_factory(
    zookeeper_factory: Callable[..., ZooKeeperServer],
) -> Callable[..., ZooKeeperServer]:
    return zookeeper_factory
