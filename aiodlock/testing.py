"""Helpers for testing code that uses aiodlock: clients on ``memory://`` spaces, where locks
behave as on a server but stay in the process; two clients on one space contend like two
processes."""

from __future__ import annotations

import uuid
from typing import Any

from ._client import Client, connect

__all__ = ["memory_client", "new_space"]


def new_space() -> str:
    """A fresh memory space name no other test uses."""
    return f"test-{uuid.uuid4().hex}"


def memory_client(space: str | None = None, **options: Any) -> Client:
    """A client on the memory space ``space`` (a fresh private one by default)."""
    if space is None:
        options.setdefault("private", True)  # (a space of its own: it goes with the client)
    return connect(f"memory://{space or new_space()}", **options)
