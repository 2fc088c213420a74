"""Several OS processes on one SQLite file: mutual exclusion, tokens, crash take-over, handoff."""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from pathlib import Path

import anyio
import pytest

import aiodlock
from tests.helpers import ServeFactory, assert_exclusive, run_cycles

from .sqlite_helpers import ClientFactory, backend_of


async def test_mutual_exclusion_and_token_order_across_processes(
    tmp_path: Path, db_url: str
) -> None:
    log = tmp_path / "log"
    procs, rounds = 4, 20
    fast = ("poll_min=0.001", "poll_max=0.005")
    entries = await run_cycles(db_url, procs, rounds, log, *fast)
    assert_exclusive(entries, procs, rounds)


@pytest.mark.slow
async def test_a_killed_holders_lock_is_taken_over_within_watchdog_ttl(
    db_url: str, make_client: ClientFactory, serve: ServeFactory
) -> None:
    ttl = 1.0
    child = await serve(db_url, "job", f"watchdog_ttl={ttl}")
    token = int(await child.ask("acquire", "HELD"))
    # Polling slowed right down: the take-over must come from the holder's lease end.
    client = await make_client(poll_min=30, poll_max=30)
    status = await client.status("job")
    assert status is not None
    assert status.token == token
    child.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await child.proc.wait()
    async with client.lock("job", timeout=30) as lease:
        took = time.monotonic() - killed_at
        assert lease.token > token
    assert took < ttl + 2.0, took
    # The row of the dead holder was taken over, not duplicated.
    assert await client.status("job") is None


async def test_cross_process_handoff_within_the_backoff_cap(
    db_url: str, make_client: ClientFactory, serve: ServeFactory
) -> None:
    poll_max = 0.1
    child = await serve(db_url, "job")
    client = await make_client(poll_max=poll_max)
    backend = backend_of(client)
    board, key = backend.board, backend.board_key("job")
    assert board is not None
    latencies = []
    tokens = []
    for _ in range(5):
        tokens.append(int(await child.ask("acquire", "HELD")))
        got = asyncio.Event()
        acquired_at = 0.0

        async def take(got: asyncio.Event = got) -> None:
            nonlocal acquired_at
            async with client.lock("job", timeout=30) as lease:
                acquired_at = time.time()
                tokens.append(lease.token)
                got.set()

        task = asyncio.create_task(take())
        try:
            with anyio.fail_after(30):
                while board.count(key) != 1:
                    await asyncio.sleep(0.002)
            # Let the waiter's backoff climb to its cap, then release in the other process.
            await anyio.sleep(poll_max * 2.5)
            released_at = float(await child.ask("release", "RELEASED"))
            with anyio.fail_after(30):
                await got.wait()
            await task
        finally:
            task.cancel()
        latencies.append(acquired_at - released_at)
    assert tokens == sorted(set(tokens))
    assert statistics.median(latencies) < poll_max + 0.3, latencies
    assert max(latencies) < poll_max + 2.0, latencies


async def test_tokens_continue_across_processes_and_restarts(
    db_url: str, serve: ServeFactory, make_client: ClientFactory
) -> None:
    seen = []
    for _ in range(3):
        child = await serve(db_url, "job")
        seen.append(int(await child.ask("acquire", "HELD")))
        await child.ask("release", "RELEASED")
        await child.ask("quit", "")
        await child.proc.wait()
    client = await make_client()
    async with client.lock("job") as lease:
        seen.append(lease.token)
    assert seen == [1, 2, 3, 4]


async def test_a_waiting_process_is_not_left_behind_by_a_cancelled_waiter(
    db_url: str, serve: ServeFactory, make_client: ClientFactory
) -> None:
    # A waiter in this process gives up; the lock still goes to whoever asks next.
    child = await serve(db_url, "job")
    client = await make_client(poll_max=0.02)
    token = int(await child.ask("acquire", "HELD"))
    with pytest.raises(aiodlock.LockTimeout):
        await client.lock("job").acquire(timeout=0.2)
    await child.ask("release", "RELEASED")
    assert await client.status("job") is None
    async with client.lock("job", timeout=5) as lease:
        assert lease.token == token + 1
