"""``client.lock(name, owner="job-17")``: a hold that belongs to the client and a key.

The contract (api.md, Locks rule 2): such a hold outlives the task that took it; any task of
the client whose lock names the same owner key is the same owner (it may extend, release, or
acquire reentrantly); it ends with its release, its loss or ``close()``.  Other owners, and
the same key in another client, are excluded like anyone else.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, eventually

T = TypeVar("T")


async def test_acquired_in_one_task_and_released_in_another(
    client: aiodlock.Client, other: aiodlock.Client
) -> None:
    lock = client.lock("handoff", owner="job-17")
    lease = await asyncio.create_task(lock.acquire())  # that task has ended
    await asyncio.sleep(0.05)
    assert lock.held
    assert not lease.lost
    assert not lease.released
    status = await other.status("handoff")
    assert status is not None
    assert status.owner == lease.owner
    assert await other.lock("handoff").try_acquire() is None
    await asyncio.create_task(lock.extend())
    await asyncio.create_task(client.lock("handoff", owner="job-17").release())
    assert lease.released
    assert not lease.lost
    assert await other.status("handoff") is None


async def test_a_thread_pool_bridge_holds_with_an_owner_key(
    client: aiodlock.Client, other: aiodlock.Client
) -> None:
    """Worker threads drive the client's loop with run_coroutine_threadsafe: each step is a
    task of its own, and the hold is the worker's from acquire to release."""
    loop = asyncio.get_running_loop()
    inside: list[int] = []
    overlaps = 0
    guard = threading.Lock()

    def call(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(HANG)

    def worker(index: int) -> list[int]:
        nonlocal overlaps
        tokens = []
        for _ in range(3):
            lock = client.lock("bridge", owner=f"worker-{index}")
            lease = call(lock.acquire(timeout=HANG))
            with guard:
                overlaps += len(inside)
                inside.append(index)
            time.sleep(0.01)
            call(lock.extend())
            with guard:
                inside.remove(index)
            call(lock.release())
            tokens.append(lease.token)
        return tokens

    with ThreadPoolExecutor(4) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, worker, i) for i in range(4)))
    assert overlaps == 0
    tokens = sorted(t for tokens in results for t in tokens)
    assert len(set(tokens)) == 12
    assert await other.status("bridge") is None


async def test_tasks_naming_one_owner_key_are_one_owner(
    client: aiodlock.Client, other: aiodlock.Client
) -> None:
    lock = client.lock("reentrant", owner="k")
    first = await lock.acquire()
    second = await asyncio.create_task(client.lock("reentrant", owner="k").acquire())
    assert second is first
    await asyncio.create_task(lock.release())
    assert lock.held  # one acquire is left to release
    assert await other.status("reentrant") is not None
    await lock.release()
    assert not lock.held
    assert first.released
    assert await other.status("reentrant") is None
    # Acquires started together by several tasks of one key: one holding, counted thrice.
    together = [client.lock("together", owner="k").acquire() for _ in range(3)]
    leases = await asyncio.gather(*together)
    assert leases[0] is leases[1] is leases[2]
    for _ in range(3):
        assert await other.status("together") is not None
        await asyncio.create_task(client.lock("together", owner="k").release())
    assert await other.status("together") is None


async def test_other_owners_are_still_excluded(
    client: aiodlock.Client, other: aiodlock.Client
) -> None:
    lease = await client.lock("excluded", owner="a").acquire()
    assert await client.lock("excluded", owner="b").try_acquire() is None
    assert await client.lock("excluded").try_acquire() is None  # a task, no key
    assert await other.lock("excluded", owner="a").try_acquire() is None  # another client
    with pytest.raises(aiodlock.LockNotOwned, match="owner 'b'"):
        await client.lock("excluded", owner="b").release()
    with pytest.raises(aiodlock.LockNotOwned, match="this task"):
        await client.lock("excluded").release()
    with pytest.raises(aiodlock.LockNotOwned):
        await other.lock("excluded", owner="a").extend()
    # The owner string is scoped to the client: the same key in two clients never collides.
    assert lease.owner.startswith(client.id)
    assert not lease.owner.startswith(other.id)
    await client.lock("excluded", owner="a").release()
    async with other.lock("excluded", owner="a", timeout=HANG) as theirs:
        assert theirs.owner != lease.owner


async def test_without_an_owner_key_a_hold_still_ends_with_its_task(
    client: aiodlock.Client, other: aiodlock.Client
) -> None:
    lease = await asyncio.create_task(client.lock("task-bound").acquire())
    await eventually(lambda: lease.released, what="released when its task ended")
    await eventually(_free(other, "task-bound"), what="free on the server")
    async with client.lock("task-bound"):
        rival = asyncio.create_task(client.lock("task-bound").try_acquire())
        assert await rival is None  # another task of the same client is another owner


async def test_an_owner_key_hold_ends_with_close(make_client: ClientFactory) -> None:
    client = await make_client()
    observer = await make_client()
    lease = await asyncio.create_task(client.lock("closing", owner="k").acquire())
    await asyncio.wait_for(client.close(), HANG)
    assert lease.lost or lease.released
    assert await observer.status("closing") is None


@pytest.mark.parametrize("owner", ["", "x" * 257, 17, b"k"])
def test_a_bad_owner_key_is_refused(client: aiodlock.Client, owner: Any) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="owner"):
        client.lock("bad", owner=owner)


def _free(observer: aiodlock.Client, name: str) -> Any:
    async def check() -> bool:
        return await observer.status(name) is None

    return check
