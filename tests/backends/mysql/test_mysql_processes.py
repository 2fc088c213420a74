"""Several OS processes on one MariaDB: exclusion and tokens, a killed holder, a restart."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, ServeFactory, assert_exclusive, run_cycles
from tests.servers import MariaDBServer


@pytest.mark.parametrize(
    "strategy",
    [
        "table",
        pytest.param("named", marks=pytest.mark.slow),
        pytest.param("row", marks=pytest.mark.slow),
    ],
)
async def test_mutual_exclusion_and_token_order_across_processes(
    tmp_path: Path, mysql_url: str, namespace: str, strategy: str
) -> None:
    log = tmp_path / "log"
    procs, rounds = 3, 10
    options = (
        f"namespace={namespace}",
        f"strategy={strategy}",
        "poll_min=0.001",
        "poll_max=0.005",
    )
    entries = await run_cycles(mysql_url, procs, rounds, log, *options)
    assert_exclusive(entries, procs, rounds)


@pytest.mark.slow
async def test_a_killed_holders_lock_is_taken_over_after_its_lease(
    mysql_url: str, namespace: str, make_client: ClientFactory, serve: ServeFactory
) -> None:
    ttl = 1.0
    child = await serve(mysql_url, "job", f"namespace={namespace}", f"watchdog_ttl={ttl}")
    token = int(await child.ask("acquire", "HELD"))
    client = await make_client(poll_min=0.05, poll_max=0.1)
    status = await client.status("job")
    assert status is not None
    assert status.token == token
    child.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await child.proc.wait()
    async with client.lock("job", timeout=HANG) as lease:
        took = time.monotonic() - killed_at
        assert lease.token > token  # (a new row: a larger id)
    assert took < ttl + 2.0, took
    assert await client.status("job") is None


@pytest.mark.slow
async def test_a_restart_of_the_server_keeps_the_lock(
    mariadb_factory: Callable[..., MariaDBServer], make_client: ClientFactory
) -> None:
    server = mariadb_factory()
    ttl = 3.0
    client = await make_client(server.url, watchdog_ttl=ttl)
    other = await make_client(server.url)
    lock = client.lock("job")
    lease = await lock.acquire()
    await asyncio.to_thread(server.restart)  # the rows are on disk: the lease survives
    # The watchdog reconnects and renews: the lease outlives several ttls.
    await asyncio.sleep(ttl * 1.5)
    assert not lease.lost
    status = await other.status("job")
    assert status is not None
    assert status.owner == lease.owner
    assert status.expires_in is not None
    assert status.expires_in > ttl / 3
    assert await other.lock("job").try_acquire() is None
    await lock.release()
    async with other.lock("job", timeout=HANG) as second:
        assert second.token > lease.token  # (the id survived the restart)


async def test_a_process_that_waits_is_woken_by_another_process_release(
    mysql_url: str, namespace: str, make_client: ClientFactory, serve: ServeFactory
) -> None:
    child = await serve(mysql_url, "job", f"namespace={namespace}")
    client = await make_client(poll_max=0.05)
    token = int(await child.ask("acquire", "HELD"))
    with pytest.raises(aiodlock.LockTimeout):
        await client.lock("job").acquire(timeout=0.2)

    async def wait() -> int:
        async with client.lock("job", timeout=HANG) as lease:
            return lease.token

    waiter = asyncio.create_task(wait())
    await child.ask("release", "RELEASED")
    assert await asyncio.wait_for(waiter, HANG) > token
