"""Fixtures for the etcd backend tests (a real single member from tests/conftest.py).

* ``make_client(url=None, **options)``: an open aiodlock client in a fresh namespace;
* ``raw``: a plain etcd3aio client on the shared member, to read the keys directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from etcd3aio import Etcd3Client

from tests.servers import EtcdServer

pytestmark = pytest.mark.etcd


@pytest.fixture
def lock_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url


@pytest.fixture
def client_options(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "watchdog_ttl": 5.0, "op_timeout": 5.0}


@pytest.fixture
async def raw(etcd_server: EtcdServer) -> AsyncIterator[Etcd3Client]:
    client = Etcd3Client([etcd_server.address])
    await client.connect()
    yield client
    await client.close()
