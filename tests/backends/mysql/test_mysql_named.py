"""``strategy="named"``: GET_LOCK on one holder session per client."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Callable

import pytest

import aiodlock
from aiodlock.backends.mysql.named import NamedBackend
from tests.helpers import HANG, ClientFactory, ServeFactory, eventually, take_turns
from tests.servers import MariaDBServer

from .test_mysql_locking import NAMES


@pytest.fixture
def lock_url(mysql_url: str) -> str:
    return mysql_url + "?strategy=named"


def named(client: aiodlock.Client) -> NamedBackend:
    backend = client.backend
    assert isinstance(backend, NamedBackend)
    return backend


def used(server: MariaDBServer, backend: NamedBackend, *names: str) -> int:
    """How many of ``names`` a session holds on the server (any client's)."""
    hashed = [backend.server_name(name) for name in names]  # (hex: safe in a test's SQL)
    rows = server.sql("SELECT " + " + ".join(f"(IS_USED_LOCK('{h}') IS NOT NULL)" for h in hashed))
    return int(rows[0][0])


async def test_exclusion_tokens_and_names_on_one_session(
    make_client: ClientFactory, mariadb_server: MariaDBServer
) -> None:
    clients = [await make_client(poll_min=0.001, poll_max=0.01) for _ in range(2)]
    tokens = await take_turns(clients, "shared", tasks=6, rounds=5)
    assert tokens == list(range(1, 31))
    # Awkward names: each its own lock, all on one session; MariaDB's case-insensitive,
    # 64-character names never see them (only their hashes).
    first, second = clients
    lock = first.lock(NAMES[0])
    async with lock as outer, lock as inner:  # reentrant: one server lock
        assert inner.token == outer.token
        for name in NAMES[1:]:
            await first.lock(name).acquire(timeout=HANG)
        assert used(mariadb_server, named(first), *NAMES) == len(NAMES)
        for name in NAMES:
            assert await second.lock(name).try_acquire() is None
            status = await second.status(name)
            assert status is not None
            assert status.owner == outer.owner
        for name in NAMES[1:]:
            await first.lock(name).release()
    assert used(mariadb_server, named(first), *NAMES) == 0


async def test_timeouts_and_cancellation_leave_no_session_lock(
    client: aiodlock.Client, make_client: ClientFactory, mariadb_server: MariaDBServer
) -> None:
    other = await make_client()
    async with other.lock("busy"):
        started = time.monotonic()
        with pytest.raises(aiodlock.LockTimeout):
            await client.lock("busy").acquire(timeout=0.3)
        assert 0.25 < time.monotonic() - started < 3.0
    rng = random.Random(3)

    async def hold() -> None:
        async with client.lock("c", timeout=HANG):
            await asyncio.sleep(rng.uniform(0, 0.005))

    for _ in range(30):
        task = asyncio.create_task(hold())
        await asyncio.sleep(rng.uniform(0, 0.01))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await eventually(lambda: used(mariadb_server, named(client), "c") == 0)
    assert await other.lock("c").try_acquire() is not None
    await other.lock("c").release()


@pytest.mark.slow
async def test_a_killed_holder_frees_its_locks_at_once(
    lock_url: str, namespace: str, make_client: ClientFactory, serve: ServeFactory
) -> None:
    child = await serve(lock_url, "job", f"namespace={namespace}", "watchdog_ttl=60")
    token = int(await child.ask("acquire", "HELD"))
    client = await make_client(poll_min=0.01, poll_max=0.05)
    assert await client.lock("job").try_acquire() is None
    child.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await child.proc.wait()
    async with client.lock("job", timeout=HANG) as lease:
        took = time.monotonic() - killed_at
        assert lease.token == token + 1
    assert took < 2.0, took  # not the 60 s lease: the session's end freed it


@pytest.mark.slow
async def test_a_server_restart_loses_every_lock_and_cancels_the_bodies(
    mariadb_factory: Callable[..., MariaDBServer], make_client: ClientFactory
) -> None:
    server = mariadb_factory()
    client = await make_client(server.url + "?strategy=named", watchdog_ttl=1.5)
    entered = [asyncio.Event(), asyncio.Event()]

    async def body(i: int) -> None:
        async with client.lock(f"job{i}"):
            entered[i].set()
            await asyncio.sleep(HANG)

    tasks = [asyncio.create_task(body(i)) for i in range(2)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in entered)), HANG)
    await asyncio.to_thread(server.restart)
    for task in tasks:
        with pytest.raises(aiodlock.LockLost):
            await asyncio.wait_for(task, HANG)
    # A new session: the names can be taken again.
    async with client.lock("job0", timeout=HANG) as lease:
        assert lease.token == 2


async def test_force_release_ends_the_holders_session(make_client: ClientFactory) -> None:
    client = await make_client(watchdog_ttl=1.5)  # a keep-alive every 0.5 s
    admin = await make_client()
    lost = asyncio.Event()
    lease = await client.lock("job", on_lost=lambda _lease: lost.set()).acquire()
    assert await admin.force_release("job") is True
    await asyncio.wait_for(lost.wait(), HANG)  # noticed by the keep-alive
    assert lease.lost
    async with admin.lock("job", timeout=HANG) as taken:
        assert taken.token == lease.token + 1
    assert await admin.force_release("job") is False
