"""Helpers shared by the SQLite backend tests (a uniquely named module, not a conftest)."""

from __future__ import annotations

import aiodlock
from aiodlock.backends.sqlite import SQLiteBackend
from tests.helpers import ClientFactory as ClientFactory

#: ``await make_client(url=None, **options)`` -> an open client (closed at teardown).


def backend_of(client: aiodlock.Client) -> SQLiteBackend:
    backend = client.backend
    assert isinstance(backend, SQLiteBackend)
    return backend
