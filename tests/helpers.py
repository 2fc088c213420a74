"""Helpers every test folder shares: open-client factories and polling with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import aiodlock

#: Generous upper bound for "this must not hang" (the machine is shared and loaded).
HANG = 30.0


class ClientFactory(Protocol):
    """``await make_client(url=None, **options)``: an open client, closed at teardown."""

    def __call__(self, url: str | None = None, **options: Any) -> Awaitable[aiodlock.Client]: ...


@contextlib.asynccontextmanager
async def open_clients(default_url: str, **defaults: Any) -> AsyncIterator[ClientFactory]:
    """A :class:`ClientFactory` on ``default_url``; ``defaults`` fill options not given."""
    clients: list[aiodlock.Client] = []

    async def make(url: str | None = None, **options: Any) -> aiodlock.Client:
        for key, value in defaults.items():
            options.setdefault(key, value)
        client = aiodlock.connect(url or default_url, **options)
        await client.open()
        clients.append(client)
        return client

    try:
        yield make
    finally:
        for client in reversed(clients):
            with contextlib.suppress(Exception):
                await client.close()


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = HANG, what: str = ""
) -> None:
    """Poll ``check`` until it is true (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s {what}".strip())
        await asyncio.sleep(0.01)
