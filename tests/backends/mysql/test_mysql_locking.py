"""The lock table on a real MariaDB inside one process: exclusion, tokens, take-over of an
expired row, awkward names, cancellation, the pool, and the errors a user can meet."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import Callable

import anyio
import pytest

import aiodlock
from aiodlock._types import Busy, Grant, Request
from tests.helpers import HANG, ClientFactory, eventually, take_turns
from tests.servers import MariaDBServer

from .mysql_helpers import DRIVERS, backend_of

Rows = Callable[[], list[tuple[str, ...]]]


async def test_exclusion_and_strictly_increasing_tokens_across_tasks_and_clients(
    make_client: ClientFactory, rows: Rows
) -> None:
    clients = [await make_client(poll_min=0.001, poll_max=0.01) for _ in range(2)]
    tokens = await take_turns(clients, "shared", tasks=8, rounds=5)
    assert len(tokens) == 40
    assert tokens == sorted(set(tokens)), "tokens must strictly increase in order of entry"
    assert rows() == []


async def test_reentrancy_keeps_one_row_and_one_token(client: aiodlock.Client, rows: Rows) -> None:
    lock = client.lock("re")
    async with lock as outer:
        async with lock as inner:
            assert inner.token == outer.token
            assert len(rows()) == 1
        assert len(rows()) == 1  # still held by the outer level
    assert rows() == []


async def test_timeouts_and_try_lock(client: aiodlock.Client, other: aiodlock.Client) -> None:
    async with client.lock("busy"):
        assert await other.lock("busy").try_acquire() is None
        started = time.monotonic()
        with pytest.raises(aiodlock.LockTimeout):
            await other.lock("busy").acquire(timeout=0.3)
        waited = time.monotonic() - started
        assert 0.25 < waited < 3.0, waited
    async with other.lock("busy", timeout=HANG) as lease:
        assert lease.token > 1  # (ids: a failed INSERT may use one up)


async def test_an_expired_row_is_taken_over_once_with_the_version(
    client: aiodlock.Client, rows: Rows
) -> None:
    backend = backend_of(client)
    first = await backend.try_acquire(Request("job", "a", 0.2), will_wait=False)
    assert isinstance(first, Grant)
    assert isinstance(await backend.try_acquire(Request("job", "b", 10), will_wait=False), Busy)
    await asyncio.sleep(0.3)  # the lease's end on the server's clock (no event to wait on)
    # Two contenders for the expired row: exactly one wins the optimistic UPDATE.
    outcomes = await asyncio.gather(
        *(backend.try_acquire(Request("job", f"c{i}", 10), will_wait=False) for i in range(4))
    )
    winners = [o for o in outcomes if isinstance(o, Grant)]
    assert len(winners) == 1
    assert winners[0].token > first.token
    assert await backend.release(first) is False  # the old holder's release changes nothing
    status = await backend.status("job")
    assert status is not None
    assert status.owner == winners[0].owner
    assert len(rows()) == 1


NAMES = [
    "Key",
    "key",  # a binary collation: two locks
    'o\'brien "quoted" `tick` ; DROP TABLE aiodlock_locks; --',
    "back\\slash\\\\ and %s and %% and ?",
    "nul\0inside",
    "ünïcödé ✓ 锁 🔒",
    "lone \ud800 surrogate",
    "x" * 512,
    "🔒" * 512,  # 2048 bytes of UTF-8: the longest a name gets
]


async def test_awkward_names_are_separate_locks_stored_exactly(
    client: aiodlock.Client, other: aiodlock.Client, rows: Rows
) -> None:
    leases = [await client.lock(name).acquire(timeout=HANG) for name in NAMES]
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(set(tokens))  # (the rows' own ids)
    stored = {bytes.fromhex(row[0]) for row in rows()}
    assert stored == {name.encode("utf-8", "surrogatepass") for name in NAMES}
    for name in NAMES:
        assert await other.lock(name).try_acquire() is None
        status = await other.status(name)
        assert status is not None
        assert status.name == name
    for name in NAMES:
        await client.lock(name).release()
    assert rows() == []


async def test_cancellation_at_random_points_leaves_no_row(
    client: aiodlock.Client,
    other: aiodlock.Client,
    rows: Rows,
    mariadb_server: MariaDBServer,
    namespace: str,
) -> None:
    rng = random.Random(7)
    entered = 0

    async def hold() -> None:
        nonlocal entered
        async with client.lock("c", timeout=HANG):
            entered += 1
            await asyncio.sleep(rng.uniform(0, 0.005))

    for i in range(40):
        task = asyncio.create_task(hold())
        # (an uncontended acquire is one round trip: every third cancellation comes as soon
        # as its request is on its way, the others at random)
        await asyncio.sleep(0 if i % 3 == 0 else rng.uniform(0, 0.015))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await eventually(lambda: rows() == [], what="the cancelled acquire left a row")
    # A cancelled WAITER leaves the holder's row alone, and nothing of its own.
    async with other.lock("c") as held:
        task = asyncio.create_task(client.lock("c").acquire(timeout=HANG))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [row[2] for row in rows()] == [str(held.token)]
    assert rows() == []
    # ... and no place in the line of waiters (the waiter had turned urgent: it had one).
    line = f"SELECT COUNT(*) FROM aiodlock_waiters WHERE namespace = '{namespace}'"
    assert mariadb_server.sql(line) == [("0",)]
    assert 0 < entered < 40  # cancelled before, during and after the grant


async def test_waiters_hold_no_connection_while_they_sleep(make_client: ClientFactory) -> None:
    holder = await make_client()
    waiting = await make_client(pool_size=2, poll_min=0.01, poll_max=0.05)
    held = holder.lock("pool")
    lease = await held.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        async with waiting.lock("pool", timeout=HANG):
            order.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(30)]
    await asyncio.sleep(0.2)
    # 30 waiters on a pool of 2: a call still gets a connection at once.
    with anyio.fail_after(2.0):
        status = await waiting.status("pool")
    assert status is not None
    assert status.owner == lease.owner
    await held.release()
    with anyio.fail_after(HANG):
        await asyncio.gather(*tasks)
    assert sorted(order) == list(range(30))


@pytest.mark.parametrize("driver", DRIVERS)
async def test_mariadb_scheme_and_a_masked_password(
    driver: str, mariadb_server: MariaDBServer
) -> None:
    url = f"mariadb://root:S3CRETzq@{mariadb_server.address}/{mariadb_server.database}"
    client = aiodlock.connect(url, driver=driver)
    assert "S3CRETzq" not in repr(client)
    assert "S3CRETzq" not in repr(client.backend)
    with pytest.raises(aiodlock.BackendError) as info:
        await client.open()
    text = str(info.value)
    assert "wrong user name or password" in text
    assert "S3CRETzq" not in text
    assert "S3CRETzq" not in repr(info.value)
    assert not info.value.transient


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_missing_database_is_named(driver: str, mariadb_server: MariaDBServer) -> None:
    client = aiodlock.connect(f"mysql://root@{mariadb_server.address}/no_such_db", driver=driver)
    with pytest.raises(aiodlock.BackendError, match=r"does not exist.*no_such_db"):
        await client.open()


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_server_that_is_down_is_a_transient_error(driver: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        url = f"mysql://root@127.0.0.1:{port}/db"
        client = aiodlock.connect(url, connect_timeout=2, driver=driver)
        with anyio.fail_after(HANG), pytest.raises(aiodlock.BackendError) as info:
            await client.open()
    assert info.value.transient
    assert "could not be reached" in str(info.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@127.0.0.1:1", "needs a database name"),
        ("mysql://root@127.0.0.1:1/a/b", "needs a database name"),
        ("mysql://root@h1:1,h2:2/db", "names one server"),
        ("mysql://root@127.0.0.1:1/db?strategy=bogus", "option 'strategy'"),
        ("mysql://root@127.0.0.1:1/db?pool_size=0", "option 'pool_size'"),
        ("mysql://root@127.0.0.1:1/db?poll_min=1&poll_max=0.5", "poll_min"),
        ("mysql://root@127.0.0.1:1/db?driver=pymysql", "option 'driver'"),
        ("mysql://root@127.0.0.1:1/db?nonsense=1", "nonsense"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str, message: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=message):
        aiodlock.connect(url)


def test_fair_is_the_tables_only(mariadb_server: MariaDBServer) -> None:
    # (the order itself: tests/contract's test_fair_locks_grant_in_request_order)
    aiodlock.connect(mariadb_server.url).lock("x", fair=True)
    for strategy in ("named", "row"):
        client = aiodlock.connect(f"{mariadb_server.url}?strategy={strategy}")
        with pytest.raises(aiodlock.Unsupported):
            client.lock("x", fair=True)


@pytest.mark.parametrize("strategy", ["table", "named", "row"])
async def test_every_strategy_runs_on_asyncmy(
    strategy: str, mariadb_server: MariaDBServer, namespace: str
) -> None:
    pytest.importorskip("asyncmy")  # (the table's whole contract: tests/contract)
    url = f"{mariadb_server.url}?strategy={strategy}&driver=asyncmy"
    async with (
        aiodlock.connect(url, namespace=namespace) as one,
        aiodlock.connect(url, namespace=namespace) as two,
    ):
        async with one.lock("job") as first:
            assert await two.lock("job").try_acquire() is None
            status = await two.status("job")
            assert status is not None
            assert status.token == first.token
        async with two.lock("job", timeout=HANG) as second:
            assert second.token > first.token
        assert await one.status("job") is None
