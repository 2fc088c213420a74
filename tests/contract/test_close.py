"""``close()``: it ends every wait, releases every lock, and leaves nothing on the server.

The contract (api.md, Connecting): when ``close()`` returns, nothing of the client is left on
any server, including a grant that was on its way to a waiting task; waiting tasks get
``LockError``; a closed client refuses new acquisitions until ``open()`` is called again.
Each test checks the server through a second client (status, and a lock taken at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, eventually


async def _free(observer: aiodlock.Client, name: str) -> None:
    """``name`` is free on the server now (not after some lease runs out)."""
    assert await observer.status(name) is None
    lease = await observer.lock(name).try_acquire()
    assert lease is not None, f"{name!r} is still held after close()"
    await observer.lock(name).release()


async def test_close_while_the_lock_passes_between_tasks(make_client: ClientFactory) -> None:
    """Five tasks of one client contend and one body raises: the client is closed while
    the lock passes from task to task (the gather of a web handler)."""
    client = aiodlock.connect(_url(make_client), namespace=_namespace(make_client))
    observer = await make_client()
    rounds = 0

    async def worker(index: int) -> None:
        nonlocal rounds
        for _ in range(1000):
            async with client.lock("passing"):
                rounds += 1
                if index == 0 and rounds >= 20:
                    raise RuntimeError("a body failed")
                await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="a body failed"):
        async with client:
            await asyncio.gather(*(worker(i) for i in range(5)))
    await _free(observer, "passing")
    # The other workers carry on in the background: each gets LockError or LockLost, never
    # a lock (the client is closed) and never a hang.
    await asyncio.sleep(0.05)
    await _free(observer, "passing")


async def test_close_ends_waits_with_lock_error_and_releases(make_client: ClientFactory) -> None:
    client = await make_client()
    observer = await make_client()
    holder = await make_client()
    lease = await client.lock("held").acquire()
    await holder.lock("elsewhere").acquire()
    waiting = [asyncio.create_task(client.lock("elsewhere").acquire()) for _ in range(3)]
    waiting.append(asyncio.create_task(client.lock("held").acquire()))
    await asyncio.sleep(0.05)  # (they are asleep, waiting)
    await asyncio.wait_for(client.close(), HANG)
    for task in waiting:
        with pytest.raises(aiodlock.LockError, match="closed") as info:
            await asyncio.wait_for(task, HANG)
        assert not isinstance(info.value, aiodlock.BackendError)
    assert lease.lost
    await _free(observer, "held")
    await holder.lock("elsewhere").release()
    await _free(observer, "elsewhere")


async def test_a_closed_client_refuses_until_opened_again(make_client: ClientFactory) -> None:
    client = await make_client()
    observer = await make_client()
    await client.close()
    with pytest.raises(aiodlock.LockError, match="open"):
        await client.lock("refused").acquire()
    with pytest.raises(aiodlock.LockError, match="open"):
        await client.status("refused")
    assert not client.is_open
    assert await observer.status("refused") is None
    await client.open()
    async with client.lock("refused") as lease:
        assert lease.token > 0
    await client.close()


@pytest.mark.parametrize("turns", [0, 1, 2, 3, 5, 8, 13])
async def test_close_during_an_acquire_in_flight(make_client: ClientFactory, turns: int) -> None:
    client = await make_client()
    observer = await make_client()
    task = asyncio.create_task(client.lock("in-flight").acquire())
    for _ in range(turns):
        await asyncio.sleep(0)
    await asyncio.wait_for(client.close(), HANG)
    outcome = (await asyncio.gather(asyncio.wait_for(task, HANG), return_exceptions=True))[0]
    if isinstance(outcome, aiodlock.Lease):
        # granted before close() began: released by close() or when its task ended
        assert outcome.lost or outcome.released
    else:
        assert isinstance(outcome, aiodlock.LockError), outcome
        assert "closed" in str(outcome)
    await _free(observer, "in-flight")


async def test_close_lets_a_release_begun_by_a_cancelled_task_finish(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A web server cancels the request tasks that hold locks, then closes at once: the
    releases go through, and no warning claims otherwise (no false alarm on every deploy)."""
    client = await make_client()
    observer = await make_client()
    entered = asyncio.Event()

    async def handler(name: str) -> None:
        async with client.lock(name):
            entered.set()
            await asyncio.sleep(HANG)

    tasks = [asyncio.create_task(handler(f"request-{i}")) for i in range(4)]
    await asyncio.wait_for(entered.wait(), HANG)
    await eventually(
        lambda: _all_held(observer, [f"request-{i}" for i in range(4)]), what="all held"
    )
    for task in tasks:
        task.cancel()
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="aiodlock"):
        await asyncio.wait_for(client.close(), HANG)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, aiodlock.LockError):
                await task
    for i in range(4):
        await _free(observer, f"request-{i}")
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def _all_held(observer: aiodlock.Client, names: list[str]) -> bool:
    return all([await observer.status(name) is not None for name in names])


def _url(make_client: ClientFactory) -> str:
    url: str = make_client.url  # type: ignore[attr-defined]
    return url


def _namespace(make_client: ClientFactory) -> str:
    namespace: str = make_client.options["namespace"]  # type: ignore[attr-defined]
    return namespace
