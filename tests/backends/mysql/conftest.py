"""Fixtures for the MySQL/MariaDB backend tests: the shared MariaDB of tests/conftest.py
(started on a free loopback port, never the machine's own service), clients on it in a fresh
namespace per test, and ``rows()`` to look at the lock table directly."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import aiodlock
from tests.helpers import ClientFactory
from tests.servers import MariaDBServer

pytestmark = pytest.mark.mysql


@pytest.fixture
def mysql_url(mariadb_server: MariaDBServer) -> str:
    return mariadb_server.url


@pytest.fixture
def lock_url(mysql_url: str) -> str:
    return mysql_url


@pytest.fixture
async def other(make_client: ClientFactory) -> aiodlock.Client:
    """A second client of the same server and namespace: another process, in effect."""
    return await make_client()


@pytest.fixture
def rows(mariadb_server: MariaDBServer, namespace: str) -> Callable[[], list[tuple[str, ...]]]:
    """``rows()``: the lock rows of the test's namespace as (name in hex, owner, token)."""

    def read() -> list[tuple[str, ...]]:
        return mariadb_server.sql(
            "SELECT HEX(name), owner, token FROM aiodlock_locks "
            f"WHERE namespace = '{namespace}' ORDER BY name"  # (a test's own hex namespace)
        )

    return read
