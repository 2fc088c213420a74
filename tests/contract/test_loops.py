"""One client, one event loop; and clients in several loops (threads) of one process.

The contract (api.md, Connecting): a client belongs to the event loop that opened it; used
from another loop it raises ``LockError`` saying so, it never hangs and never holds a lock
without its watchdog.  Two clients in two loops exclude each other like any two clients, and
a release in one loop wakes a waiter in the other at once (``memory://`` included).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aiodlock
from tests.helpers import HANG, in_threads


def test_a_client_refuses_every_use_from_another_loop(lock_url: str, namespace: str) -> None:
    """A client opened in one loop and used under a second ``asyncio.run`` (a module-scoped
    client with a loop per test) raises LockError for every use, and its first loop keeps
    holding the lock."""
    client = aiodlock.connect(lock_url, namespace=namespace)
    lock = client.lock("loops", owner="job")
    first = asyncio.new_event_loop()
    try:
        lease = first.run_until_complete(_opened_and_held(client, lock))
        uses: list[Callable[[], Awaitable[Any]]] = [
            lock.acquire,
            lock.try_acquire,
            lock.extend,
            lock.release,
            lock.status,
            client.lock("other").acquire,
            lambda: client.status("loops"),
            lambda: client.force_release("loops"),
            client.open,
            client.close,
        ]
        for use in uses:

            async def misuse(use: Callable[[], Awaitable[Any]] = use) -> None:
                with pytest.raises(aiodlock.LockError, match="another event loop"):
                    await asyncio.wait_for(use(), HANG)

            asyncio.run(misuse())
        assert not lease.lost
        assert not lease.released
        status = first.run_until_complete(lock.status())
        assert status is not None
        assert status.owner == lease.owner
        first.run_until_complete(lock.release())
        first.run_until_complete(client.close())
    finally:
        first.run_until_complete(client.close())
        first.close()

    async def reopened() -> None:  # a closed client may be opened again in another loop
        async with client, client.lock("loops") as again:
            assert again.token > lease.token

    asyncio.run(reopened())


async def _opened_and_held(client: aiodlock.Client, lock: aiodlock.Lock) -> aiodlock.Lease:
    await client.open()
    return await lock.acquire()


@pytest.mark.parametrize("timeout", [10.0, None])
def test_a_release_in_one_thread_wakes_a_waiter_in_another(
    lock_url: str, namespace: str, timeout: float | None
) -> None:
    held, waiting = threading.Event(), threading.Event()
    times: dict[str, float] = {}

    async def holder() -> None:
        async with aiodlock.connect(lock_url, namespace=namespace) as client:
            async with client.lock("threads"):
                held.set()
                assert await asyncio.to_thread(waiting.wait, HANG)
            times["released"] = time.monotonic()

    async def waiter() -> None:
        async with aiodlock.connect(lock_url, namespace=namespace) as client:
            assert await asyncio.to_thread(held.wait, HANG)
            lock = client.lock("threads", timeout=timeout, owner="waiter")
            task = asyncio.create_task(lock.acquire())
            await asyncio.sleep(0.2)  # (it is asleep, waiting)
            assert not task.done()
            waiting.set()
            await asyncio.wait_for(task, HANG)
            times["acquired"] = time.monotonic()
            await lock.release()

    in_threads(holder(), waiter())
    # (the bug: the waiter got it when its 10 s timeout ran out, or never)
    assert times["acquired"] - times["released"] < 3.0, times
