"""Fixtures for the SQLite backend tests: a fresh database file per test, clients on it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "locks.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    return f"sqlite:///{db_path}"


@pytest.fixture
def lock_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def client_options() -> dict[str, Any]:
    return {}  # (the default namespace: the tests read the tables directly)


@pytest.fixture
def raw_db(db_path: Path) -> Iterator[Callable[[], sqlite3.Connection]]:
    """A plain sqlite3 connection on the test's file, to look at the tables."""
    conns: list[sqlite3.Connection] = []

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=10)
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()
