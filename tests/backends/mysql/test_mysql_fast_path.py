"""The lock table's one-statement attempt and release (aiodlock/backends/_sql_fast.py) keep
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


def state(server: MariaDBServer, namespace: str, name: str = "job") -> list[tuple[str, ...]]:
    """The name's row as (owner, token, waiting, expired), or []."""
    return server.sql(
        "SELECT owner, token, waiting, expires_at <= CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 "
        f"AS SIGNED) FROM aiodlock_locks WHERE namespace = '{namespace}' "
        f"AND name = UNHEX('{name.encode().hex()}')"
    )


async def test_a_retried_attempt_of_the_owner_keeps_its_token(
    backend: MySQLBackend, rows: Rows
) -> None:
    first = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(first, Grant)
    again = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(again, Grant)
    assert again.token == first.token
    assert [row[1:] for row in rows()] == [("a", str(first.token))]
    assert await backend.release(again) is True
    assert rows() == []


async def test_a_busy_attempt_says_how_long(backend: MySQLBackend) -> None:
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    for _ in range(3):
        busy = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
        assert isinstance(busy, Busy)
        assert busy.retry_after is not None
        assert 5 < busy.retry_after <= 10
    assert await backend.release(held) is True
    after = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
    assert isinstance(after, Grant)
    assert after.token > held.token


async def test_nobody_barges_past_a_live_line_of_waiters(
    backend: MySQLBackend, mariadb_server: MariaDBServer, namespace: str
) -> None:
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    assert state(mariadb_server, namespace) == [("a", str(held.token), "0", "0")]
    # A fair waiter of another owner takes a place in line, and marks the row.
    fair = Request("job", "f", 10, fair=True)
    assert isinstance(await backend.try_acquire(fair, will_wait=True), Busy)
    assert fair.queued
    assert state(mariadb_server, namespace) == [("a", str(held.token), "1", "0")]
    # The release cannot delete a marked row: it vacates it for the first in line.
    assert await backend.release(held) is True
    assert [r[0] for r in state(mariadb_server, namespace)] == [""]
    assert await backend.status("job") is None  # (a vacant row is free)
    # The row is there: a plain INSERT hits the key; the scripts respect the line.
    for _ in range(3):
        barger = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
        assert isinstance(barger, Busy)
    served = await backend.try_acquire(fair, will_wait=True)
    assert isinstance(served, Grant)
    assert served.token > held.token
    assert state(mariadb_server, namespace) == [("f", str(served.token), "0", "0")]
    assert await backend.release(served) is True  # (the fast path: nobody waits)
    assert state(mariadb_server, namespace) == []
    # The line is empty again: the fast path takes the name.
    assert isinstance(await backend.try_acquire(Request("job", "b", 10), will_wait=False), Grant)


async def test_a_vacant_row_frees_when_its_line_empties(
    backend: MySQLBackend, mariadb_server: MariaDBServer, namespace: str
) -> None:
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    fair = Request("job", "f", 10, fair=True)
    assert isinstance(await backend.try_acquire(fair, will_wait=True), Busy)
    assert await backend.release(held) is True
    assert [r[0] for r in state(mariadb_server, namespace)] == [""]
    # The only waiter leaves: the vacant row goes with it.
    await backend.abandon(fair)
    assert state(mariadb_server, namespace) == []
    # A waiter that dies in line: once its place runs out, anyone takes the vacant row.
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    dead = Request("job", "dead", 10, fair=True)
    assert isinstance(await backend.try_acquire(dead, will_wait=True), Busy)
    assert await backend.release(held) is True
    assert isinstance(await backend.try_acquire(Request("job", "b", 10), will_wait=False), Busy)
    mariadb_server.sql(
        f"UPDATE aiodlock_waiters SET expires_at = 0 WHERE namespace = '{namespace}'"
    )
    taken = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
    assert isinstance(taken, Grant)
    assert taken.token > held.token


async def test_tokens_increase_across_fast_path_vacate_and_take_over(
    backend: MySQLBackend, rows: Rows
) -> None:
    tokens = []
    first = await backend.try_acquire(Request("job", "a", 0.2), will_wait=False)
    assert isinstance(first, Grant)
    tokens.append(first.token)
    await asyncio.sleep(0.3)  # the lease's end on the server's clock (no event to wait on)
    # An expired row: the fast path leaves it to the optimistic take-over.
    second = await backend.try_acquire(Request("job", "b", 10), will_wait=False)
    assert isinstance(second, Grant)
    tokens.append(second.token)
    # The old holder's release changes nothing and says its row was gone.
    assert await backend.release(first) is False
    assert [row[1] for row in rows()] == ["b"]
    fair = Request("job", "f", 10, fair=True)
    assert isinstance(await backend.try_acquire(fair, will_wait=True), Busy)
    assert await backend.release(second) is True  # (vacated for the line)
    third = await backend.try_acquire(fair, will_wait=True)
    assert isinstance(third, Grant)
    tokens.append(third.token)
    assert await backend.release(third) is True
    fourth = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(fourth, Grant)
    tokens.append(fourth.token)
    assert await backend.release(fourth) is True
    assert tokens == sorted(set(tokens)), tokens


async def test_one_of_four_contenders_takes_a_vacant_row(
    backend: MySQLBackend, mariadb_server: MariaDBServer, namespace: str
) -> None:
    held = await backend.try_acquire(Request("job", "a", 10), will_wait=False)
    assert isinstance(held, Grant)
    line = Request("job", "w", 10, fair=True)
    assert isinstance(await backend.try_acquire(line, will_wait=True), Busy)
    assert await backend.release(held) is True  # (vacated for "w")
    mariadb_server.sql(
        f"UPDATE aiodlock_waiters SET expires_at = 0 WHERE namespace = '{namespace}'"
    )  # ("w" died in line)
    outcomes = await asyncio.gather(
        *(backend.try_acquire(Request("job", f"c{i}", 10), will_wait=False) for i in range(4))
    )
    winners = [o for o in outcomes if isinstance(o, Grant)]
    assert len(winners) == 1
    assert winners[0].token > held.token
    assert state(mariadb_server, namespace) == [(winners[0].owner, str(winners[0].token), "0", "0")]


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
    fast = backend.fast_path
    assert fast is not None
    fast.sweep_every = 0.5
    dead = await backend.try_acquire(Request("dead", "gone", 0.1), will_wait=False)
    assert isinstance(dead, Grant)  # (the first grant sweeps: the next one is due in 0.5 s)
    await asyncio.sleep(0.2)

    async def cycle() -> None:
        grant = await backend.try_acquire(Request("live", "a", 10), will_wait=False)
        assert isinstance(grant, Grant)
        assert await backend.release(grant) is True

    await cycle()
    assert [row[1] for row in rows()] == ["gone"]  # (expired, but no sweep was due)
    await asyncio.sleep(0.4)
    await cycle()
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
    # Nothing half-done either: nobody in line, and the name is free for another client at
    # once.
    line = f"SELECT COUNT(*) FROM aiodlock_waiters WHERE namespace = '{namespace}'"
    assert mariadb_server.sql(line) == [("0",)]
    async with other.lock("c", timeout=1) as lease:
        assert rows() == [("63", lease.owner, str(lease.token))]


@pytest.mark.slow
@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_fast_statement_to_a_server_that_stops_answering_times_out(
    driver: str, mariadb_factory: Callable[..., MariaDBServer], namespace: str
) -> None:
    """The fast path's statements are bounded by ``op_timeout`` (the connection is closed
    under them), and the client works on new connections once the server answers again.
    What the cut-short INSERT may have done there (the server runs it when it wakes) is
    cleaned up by the client in the background as soon as it can: the name is free long
    before the lease of 30 s would have freed it."""
    server = mariadb_factory()
    op_timeout = 1.0
    url = f"{server.url}?driver={driver}"
    options = {"namespace": namespace, "op_timeout": op_timeout, "connect_timeout": op_timeout}
    async with (
        aiodlock.connect(url, **options) as client,
        aiodlock.connect(url, **options) as other,
    ):
        async with client.lock("warm"):  # (an idle pooled connection: the fast path's)
            pass
        held = client.lock("held", ttl=60)
        await held.acquire()
        server.pause()
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            with pytest.raises(aiodlock.BackendTimeout):
                await client.lock("p").try_acquire()
            assert loop.time() - started < op_timeout * 3 + 1
        finally:
            server.resume()
        await held.release()  # (the fast DELETE, on a new connection)
        assert await other.status("held") is None
        started = loop.time()
        async with other.lock("p", timeout=15) as lease:
            assert not lease.lost
        assert loop.time() - started < 10
