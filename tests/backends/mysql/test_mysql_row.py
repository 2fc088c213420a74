"""``strategy="row"``: SELECT ... FOR UPDATE in a transaction held open."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Callable

import anyio
import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, ServeFactory, take_turns
from tests.servers import MariaDBServer

from .test_mysql_locking import NAMES


@pytest.fixture
def lock_url(mysql_url: str) -> str:
    return mysql_url + "?strategy=row"


def open_transactions(server: MariaDBServer) -> int:
    return int(server.sql("SELECT COUNT(*) FROM information_schema.INNODB_TRX")[0][0])


def connections(server: MariaDBServer) -> int:
    return int(server.sql("SHOW STATUS LIKE 'Threads_connected'")[0][1])


async def test_exclusion_tokens_names_and_the_servers_wait(
    make_client: ClientFactory, mariadb_server: MariaDBServer
) -> None:
    clients = [await make_client() for _ in range(2)]
    tokens = await take_turns(clients, "shared", tasks=6, rounds=4)
    assert tokens == list(range(1, 25))
    first, second = clients
    async with contextlib.AsyncExitStack() as stack:
        for name in NAMES:
            await stack.enter_async_context(first.lock(name))
        for name in NAMES:
            assert await second.lock(name).try_acquire() is None
            status = await second.status(name)
            assert status is not None
            assert status.name == name
        # A timeout finer than the server's whole seconds is kept by the client.
        started = time.monotonic()
        with pytest.raises(aiodlock.LockTimeout):
            await second.lock(NAMES[0]).acquire(timeout=0.3)
        assert 0.25 < time.monotonic() - started < 1.5
    assert await second.status(NAMES[0]) is None
    await asyncio.sleep(0)  # (the killed wait's connection is closed by now)
    assert open_transactions(mariadb_server) == 0


async def test_cancellation_leaves_no_transaction_and_waiters_cost_a_connection_each(
    client: aiodlock.Client, make_client: ClientFactory, mariadb_server: MariaDBServer
) -> None:
    rng = random.Random(5)

    async def hold() -> None:
        async with client.lock("c", timeout=HANG):
            await asyncio.sleep(rng.uniform(0, 0.005))

    for _ in range(20):
        task = asyncio.create_task(hold())
        await asyncio.sleep(rng.uniform(0, 0.02))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    other = await make_client(pool_size=2)
    assert await other.lock("c").try_acquire() is not None  # nothing left holding the row
    await other.lock("c").release()
    # 20 waiters on a pool of 2: each waits on a connection of its own, the pool stays free.
    before = connections(mariadb_server)
    holder = client.lock("c")
    await holder.acquire()
    waiters = [asyncio.create_task(other.lock("c").acquire(timeout=HANG)) for _ in range(20)]
    await asyncio.sleep(0.3)
    with anyio.fail_after(2.0):
        assert await other.status("c") is not None
    assert connections(mariadb_server) - before >= 20
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await holder.release()
    assert await other.lock("c").try_acquire() is not None
    await other.lock("c").release()


@pytest.mark.slow
async def test_a_killed_holder_frees_the_row_at_once(
    lock_url: str, namespace: str, make_client: ClientFactory, serve: ServeFactory
) -> None:
    child = await serve(lock_url, "job", f"namespace={namespace}", "watchdog_ttl=60")
    token = int(await child.ask("acquire", "HELD"))
    client = await make_client()
    waiter = asyncio.create_task(client.lock("job").acquire(timeout=HANG))
    await asyncio.sleep(0.2)
    child.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await child.proc.wait()
    lease = await asyncio.wait_for(waiter, HANG)
    assert time.monotonic() - killed_at < 2.0
    assert lease.token == token + 1


@pytest.mark.slow
async def test_a_server_restart_reports_the_lock_lost(
    mariadb_factory: Callable[..., MariaDBServer], make_client: ClientFactory
) -> None:
    server = mariadb_factory()
    client = await make_client(server.url + "?strategy=row", watchdog_ttl=1.5)
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock("job"):
            entered.set()
            await asyncio.sleep(HANG)

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), HANG)
    await asyncio.to_thread(server.restart)
    with pytest.raises(aiodlock.LockLost):
        await asyncio.wait_for(task, HANG)
    async with client.lock("job", timeout=HANG) as lease:
        assert lease.token == 2
