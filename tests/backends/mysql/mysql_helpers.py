"""Helpers of the MySQL backend tests."""

from __future__ import annotations

import aiodlock
from aiodlock.backends.mysql import MySQLBackend


def backend_of(client: aiodlock.Client) -> MySQLBackend:
    backend = client.backend
    assert isinstance(backend, MySQLBackend)
    return backend
