"""The lock table's one-round-trip attempt and release (aiodlock/backends/_sql_fast.py) keep
every invariant of the table's scripts, on a real MariaDB, with each driver."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

import pytest

import aiodlock
from aiodlock._types import Busy, Grant, Request
from aiodlock.backends.mysql import MySQLBackend
from tests.helpers import HANG, eventually
from tests.servers import MariaDBServer

from .mysql_helpers import DRIVERS, backend_of

Rows = Callable[[], list[tuple[str, ...]]]


@pytest.fixture(params=DRIVERS)
def lock_url(request: pytest.FixtureRequest, mysql_url: str) -> str:
    return f"{mysql_url}?driver={request.param}"


@pytest.fixture
async def backend(client: aiodlock.Client) -> MySQLBackend:
    backend = backend_of(client)
    assert backend.fast_path is not None
    return backend


def counter(server: MariaDBServer, namespace: str, name: str) -> int:
    rows = server.sql(
        f"SELECT token FROM aiodlock_counters WHERE namespace = '{namespace}' "
        f"AND name = UNHEX('{name.encode().hex()}')"
    )
    return int(rows[0][0]) if rows else 0


async def test_a_retried_attempt_of_the_owner_keeps_its_token(
    backend: MySQLBackend, rows: Rows, mariadb_server: MariaDBServer, namespace: str
) -> None:
    first = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(first, Grant)
    again = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(again, Grant)
    assert again.token == first.token
    assert counter(mariadb_server, namespace, "job") == first.token  # counted once
    assert [row[1:] for row in rows()] == [("a", str(first.token))]
    assert await backend.release(again) is True
    assert rows() == []


async def test_a_busy_attempt_takes_no_token_and_says_how_long(
    backend: MySQLBackend, mariadb_server: MariaDBServer, namespace: str
) -> None:
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    for _ in range(3):
        busy = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
        assert isinstance(busy, Busy)
        assert busy.retry_after is not None
        assert 5 < busy.retry_after <= 10
    assert counter(mariadb_server, namespace, "job") == held.token
    assert await backend.release(held) is True
    after = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
    assert isinstance(after, Grant)
    assert after.token == held.token + 1


async def test_nobody_barges_past_a_live_line_of_waiters(backend: MySQLBackend) -> None:
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    # A fair waiter takes a place in line while the name is held.
    fair = Request("job", "f", 10, fair=True)
    assert isinstance(await backend.try_acquire(fair, will_wait=True), Busy)
    assert fair.queued
    assert await backend.release(held) is True
    # The name is free, but the line is not empty: the fast path must not take it.
    barger = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
    assert isinstance(barger, Busy)
    served = await backend.try_acquire(fair, will_wait=True)
    assert isinstance(served, Grant)
    assert served.token == held.token + 1
    assert await backend.release(served) is True
    # The line is empty again: the fast path takes the name.
    assert isinstance(await backend.try_acquire(Request("job", "b", 10), will_wait=False), Grant)


async def test_tokens_increase_across_take_over_and_fast_path(
    backend: MySQLBackend, rows: Rows, mariadb_server: MariaDBServer, namespace: str
) -> None:
    first = await backend.try_acquire(Request("job", "a", 0.2), will_wait=False)
    assert isinstance(first, Grant)
    await asyncio.sleep(0.3)  # the lease's end on the server's clock (no event to wait on)
    # An expired row: the fast path leaves it to the optimistic take-over.
    second = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
    assert isinstance(second, Grant)
    assert second.token == first.token + 1
    # The old holder's release changes nothing and says its row was gone.
    assert await backend.release(first) is False
    assert [row[1] for row in rows()] == ["b"]
    assert await backend.release(second) is True
    third = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(third, Grant)
    assert third.token == second.token + 1
    assert counter(mariadb_server, namespace, "job") == third.token
    assert await backend.release(third) is True


async def test_releasing_an_expired_row_reports_false_and_deletes_it(
    backend: MySQLBackend, rows: Rows
) -> None:
    grant = await backend.try_acquire(Request("job", "a", 0.2), will_wait=False)
    assert isinstance(grant, Grant)
    await asyncio.sleep(0.3)
    assert await backend.release(grant) is False
    assert rows() == []


async def test_expired_rows_of_other_names_are_swept_by_later_grants(
    backend: MySQLBackend, rows: Rows
) -> None:
    dead = await backend.try_acquire(Request("dead", "gone", 0.1), will_wait=False)
    assert isinstance(dead, Grant)
    await asyncio.sleep(0.2)
    assert backend.fast_path is not None
    for _ in range(backend.fast_path.sweep_every):
        grant = await backend.try_acquire(Request("live", "a", 10), will_wait=False)
        assert isinstance(grant, Grant)
        assert await backend.release(grant) is True
    assert rows() == []  # (the dead holder's row went with a sweep)


async def test_a_cancelled_fast_acquire_leaves_nothing_behind(
    client: aiodlock.Client,
    other: aiodlock.Client,
    rows: Rows,
    mariadb_server: MariaDBServer,
    namespace: str,
) -> None:
    rng = random.Random(11)

    async def hold() -> None:
        async with client.lock("c", timeout=HANG):
            pass

    for _ in range(30):
        task = asyncio.create_task(hold())
        await asyncio.sleep(rng.uniform(0, 0.004))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await eventually(lambda: rows() == [], what="the cancelled acquire left a row")
    # Nothing half-done either: no row with the placeholder token, nobody in line, and the
    # name is free for another client at once.
    zero = f"SELECT COUNT(*) FROM aiodlock_locks WHERE namespace = '{namespace}' AND token = 0"
    assert mariadb_server.sql(zero) == [("0",)]
    async with other.lock("c", timeout=1) as lease:
        assert lease.token == counter(mariadb_server, namespace, "c")
