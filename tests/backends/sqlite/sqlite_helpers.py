"""Helpers shared by the SQLite backend tests (a uniquely named module, not a conftest)."""

from __future__ import annotations

import sys
from pathlib import Path

import aiodlock
from aiodlock.backends.sqlite import SQLiteBackend
from tests.helpers import ClientFactory as ClientFactory

WORKER = Path(__file__).with_name("sqlite_worker.py")

#: ``await make_client(url=None, **options)`` -> an open client (closed at teardown).


def backend_of(client: aiodlock.Client) -> SQLiteBackend:
    backend = client.backend
    assert isinstance(backend, SQLiteBackend)
    return backend


def worker_command(*args: str) -> list[str]:
    """The command line of a worker process (see sqlite_worker.py)."""
    return [sys.executable, str(WORKER), *args]
