"""Helpers for testing code that uses aiodlock.

``memory_client()`` gives a client on a fresh, private ``memory://`` space: locks behave as
on a server (FIFO, fencing tokens, leases) but stay inside the process, so tests need no
server.  Make two clients on the same space to test contention between "processes"::

    import aiodlock.testing

    async def test_only_one_worker_runs() -> None:
        space = aiodlock.testing.new_space()
        async with aiodlock.testing.memory_client(space) as a, \\
                   aiodlock.testing.memory_client(space) as b:
            ...
"""

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
        # (a space of its own: it goes when the client closes)
        options.setdefault("private", True)
    return connect(f"memory://{space or new_space()}", **options)
