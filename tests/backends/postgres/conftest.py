"""Fixtures for the PostgreSQL backend tests (the shared server from tests/conftest.py).

* ``make_client(url=None, **options)``: an open client in a fresh namespace per test;
* ``raw()``: a plain asyncpg connection to the same server, to look at ``pg_locks`` and the
  tables directly (closed at teardown).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from tests.servers import PostgresServer

pytestmark = pytest.mark.postgres

RawFactory = Callable[[], Awaitable[asyncpg.Connection]]


@pytest.fixture
def lock_url(postgres_server: PostgresServer) -> str:
    return postgres_server.url


@pytest.fixture
def client_options(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "op_timeout": 3.0}


@pytest.fixture
async def raw(postgres_server: PostgresServer) -> AsyncIterator[RawFactory]:
    conns: list[asyncpg.Connection] = []

    async def make() -> asyncpg.Connection:
        conn = await asyncpg.connect(postgres_server.url, timeout=10)
        conns.append(conn)
        return conn

    yield make
    for conn in conns:
        conn.terminate()
