"""Helpers of the MySQL backend tests."""

from __future__ import annotations

import importlib.util

import pytest

import aiodlock
from aiodlock.backends.mysql import MySQLBackend

#: The drivers ``driver=`` accepts, as parameters (asyncmy's skipped where it is missing).
DRIVERS = [
    "aiomysql",
    pytest.param(
        "asyncmy",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("asyncmy") is None, reason="asyncmy is not installed"
        ),
    ),
]


def backend_of(client: aiodlock.Client) -> MySQLBackend:
    backend = client.backend
    assert isinstance(backend, MySQLBackend)
    return backend
