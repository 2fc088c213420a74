"""The SQLite lock table inside one process: the protocol, tokens, expiry, waking, errors."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiodlock
from aiodlock._types import Busy, Grant, Request, monotonic
from aiodlock.backends import sqlite as sqlite_backend
from tests.helpers import in_threads

from .sqlite_helpers import ClientFactory, backend_of

RawDB = Callable[[], sqlite3.Connection]


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` until true (fails after ``timeout``)."""
    with anyio.fail_after(timeout):
        while not predicate():
            await asyncio.sleep(0.002)


def rows(raw: RawDB) -> list[tuple[Any, ...]]:
    return (
        raw()
        .execute("SELECT namespace, name, owner, token, version FROM aiodlock_locks ORDER BY name")
        .fetchall()
    )


# -- the backend protocol ----------------------------------------------------------------


async def test_grant_busy_and_idempotent_reattempt(make_client: ClientFactory) -> None:
    backend = backend_of(await make_client())
    a = Request("job", "owner-a", ttl=5.0)
    b = Request("job", "owner-b", ttl=5.0)
    before = monotonic()
    first = await backend.try_acquire(a, will_wait=False)
    assert isinstance(first, Grant)
    assert first.token == 1
    assert first.expires_at is not None
    assert before + 5.0 <= first.expires_at <= monotonic() + 5.0
    busy = await backend.try_acquire(b, will_wait=False)
    assert isinstance(busy, Busy)
    assert busy.retry_after is not None
    assert 4.0 < busy.retry_after <= 5.0
    # The same owner again (a retried attempt whose reply was lost): same token, new lease.
    status = await backend.status("job")
    assert status is not None
    again = await backend.try_acquire(Request("job", "owner-a", ttl=60.0), will_wait=False)
    assert isinstance(again, Grant)
    assert again.token == first.token
    refreshed = await backend.status("job")
    assert refreshed is not None
    assert refreshed.expires_in is not None
    assert refreshed.expires_in > 50
    assert (refreshed.owner, refreshed.token) == ("owner-a", 1)


async def test_expired_row_is_taken_over_with_a_new_token(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    backend = backend_of(await make_client())
    old = await backend.try_acquire(Request("job", "owner-a", ttl=0.05), will_wait=False)
    assert isinstance(old, Grant)
    version_before = rows(raw_db)[0][4]
    await wait_for(lambda: time.monotonic() > (old.expires_at or 0) + 0.01)
    assert await backend.status("job") is None  # an expired row counts as free
    new = await backend.try_acquire(Request("job", "owner-b", ttl=5.0), will_wait=False)
    assert isinstance(new, Grant)
    assert new.token == old.token + 1  # a new row: the next id
    (row,) = rows(raw_db)
    assert row[2:4] == ("owner-b", new.token)
    # the take-over deleted the row it read (WHERE version) and inserted a new one
    assert row[4] == version_before == 1
    # The old holder has lost it: no renewal, no release, no effect on the new holder.
    assert await backend.renew([old], 5.0) == [None]
    assert await backend.release(old) is False
    status = await backend.status("job")
    assert status is not None
    assert status.owner == "owner-b"


async def test_an_expired_row_of_the_same_owner_gets_a_new_token(
    make_client: ClientFactory,
) -> None:
    backend = backend_of(await make_client())
    old = await backend.try_acquire(Request("job", "owner-a", ttl=0.05), will_wait=False)
    assert isinstance(old, Grant)
    await wait_for(lambda: time.monotonic() > (old.expires_at or 0) + 0.01)
    assert await backend.renew([old], 5.0) == [None]  # an expired lease is never revived
    new = await backend.try_acquire(Request("job", "owner-a", ttl=5.0), will_wait=False)
    assert isinstance(new, Grant)
    assert new.token == old.token + 1


async def test_releasing_an_expired_lease_reports_false_and_frees_the_name(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    backend = backend_of(await make_client())
    old = await backend.try_acquire(Request("job", "owner-a", ttl=0.05), will_wait=False)
    assert isinstance(old, Grant)
    await wait_for(lambda: time.monotonic() > (old.expires_at or 0) + 0.01)
    assert await backend.release(old) is False
    assert rows(raw_db) == []


async def test_renew_is_batched_and_checks_owner_and_token(make_client: ClientFactory) -> None:
    backend = backend_of(await make_client())
    g1 = await backend.try_acquire(Request("one", "me", ttl=1.0), will_wait=False)
    g2 = await backend.try_acquire(Request("two", "me", ttl=1.0), will_wait=False)
    assert isinstance(g1, Grant)
    assert isinstance(g2, Grant)
    stale = Grant("two", "me", g2.token + 7, None)
    foreign = Grant("one", "someone-else", g1.token, None)
    missing = Grant("three", "me", 1, None)
    before = monotonic()
    results = await backend.renew([g1, stale, g2, foreign, missing], 30.0)
    assert results[1:] == [None, results[2], None, None]
    assert results[0] is not None
    assert results[2] is not None
    assert before + 30.0 <= results[0] <= monotonic() + 30.0
    status = await backend.status("two")
    assert status is not None
    assert status.expires_in is not None
    assert status.expires_in > 25
    assert await backend.renew([], 1.0) == []


async def test_release_is_a_compare_and_delete(make_client: ClientFactory) -> None:
    backend = backend_of(await make_client())
    grant = await backend.try_acquire(Request("job", "me", ttl=5.0), will_wait=False)
    assert isinstance(grant, Grant)
    assert await backend.release(Grant("job", "me", grant.token + 1, None)) is False
    assert await backend.release(Grant("job", "other", grant.token, None)) is False
    assert await backend.status("job") is not None
    assert await backend.release(grant) is True
    assert await backend.status("job") is None
    assert await backend.release(grant) is False


async def test_abandon_only_removes_the_owners_row(make_client: ClientFactory) -> None:
    backend = backend_of(await make_client())
    grant = await backend.try_acquire(Request("job", "me", ttl=5.0), will_wait=False)
    assert isinstance(grant, Grant)
    await backend.abandon(Request("job", "other", 5.0))
    assert await backend.status("job") is not None
    await backend.abandon(Request("job", "me", 5.0))
    assert await backend.status("job") is None
    await backend.abandon(Request("job", "me", 5.0))  # nothing left: no error


async def test_force_release_and_status(make_client: ClientFactory) -> None:
    holder = await make_client()
    admin = await make_client()
    assert await admin.status("job") is None
    assert await admin.force_release("job") is False
    lock = holder.lock("job")
    lease = await lock.acquire()
    status = await admin.status("job")
    assert status is not None
    assert (status.name, status.owner, status.token) == ("job", lease.owner, lease.token)
    assert status.expires_in is not None
    assert 0 < status.expires_in <= holder.config.watchdog_ttl
    assert status.waiters is None
    assert await admin.force_release("job") is True
    assert await admin.status("job") is None
    with pytest.raises(aiodlock.LockLost):
        await lock.extend()
    with pytest.raises(aiodlock.LockLost):
        await lock.release()


async def test_tokens_strictly_increase_and_survive_reopening(
    make_client: ClientFactory, db_url: str
) -> None:
    tokens = []
    client = await make_client()
    for _ in range(3):
        async with client.lock("job") as lease:
            tokens.append(lease.token)
    await client.force_release("job")  # never resets the counter either
    await client.close()
    again = await make_client(db_url)
    async with again.lock("job") as lease:
        tokens.append(lease.token)
    assert tokens == [1, 2, 3, 4]


async def test_names_are_compared_exactly(make_client: ClientFactory) -> None:
    holder = backend_of(await make_client())
    other = backend_of(await make_client())
    names = ["Key", "key", "key ", "a\x00b", "a", "\ud800 lone surrogate", "ключ 🔑", "x" * 512]
    tokens = []
    for name in names:
        grant = await holder.try_acquire(Request(name, "holder", 5.0), will_wait=False)
        assert isinstance(grant, Grant), name  # every name is its own lock
        tokens.append(grant.token)
    assert tokens == sorted(set(tokens))  # (the rows' own ids: never repeated)
    for name in names:
        assert isinstance(await other.try_acquire(Request(name, "o", 5.0), will_wait=False), Busy)
        status = await other.status(name)
        assert status is not None
        assert (status.name, status.owner) == (name, "holder")
    assert await other.status("KEY") is None


async def test_namespaces_are_independent(make_client: ClientFactory) -> None:
    a = await make_client(namespace="app-a")
    b = await make_client(namespace="app-b")
    async with a.lock("job") as la, b.lock("job") as lb:
        assert la.token < lb.token  # (one sequence of row ids for the file)
        status_a, status_b = await a.status("job"), await b.status("job")
        assert status_a is not None
        assert status_b is not None
        assert (status_a.owner, status_b.owner) == (la.owner, lb.owner)


async def test_expired_rows_are_swept_by_later_grants(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    backend = backend_of(await make_client())
    past = time.time_ns() // 1000 - 1_000_000
    raw_db().executemany(
        "INSERT INTO aiodlock_locks (namespace, name, owner, expires_at, version)"
        " VALUES ('aiodlock', ?, 'ghost', ?, 1)",
        [(f"dead-{i}".encode(), past) for i in range(100)],
    )
    count = "SELECT count(*) FROM aiodlock_locks"
    assert raw_db().execute(count).fetchone()[0] == 100
    assert isinstance(await backend.try_acquire(Request("a", "me", 5), will_wait=False), Grant)
    limit = sqlite_backend.SQLITE.sweep_limit
    assert raw_db().execute(count).fetchone()[0] == 100 - limit + 1
    assert isinstance(await backend.try_acquire(Request("b", "me", 5), will_wait=False), Grant)
    assert raw_db().execute(count).fetchone()[0] == 2  # only the live ones are left


# -- through the public API --------------------------------------------------------------


async def test_mutual_exclusion_among_many_tasks_and_clients(make_client: ClientFactory) -> None:
    clients = [await make_client(poll_max=0.02) for _ in range(3)]
    inside = 0
    overlaps = 0
    tokens: list[int] = []

    async def worker(client: aiodlock.Client) -> None:
        nonlocal inside, overlaps
        for _ in range(8):
            async with client.lock("shared", timeout=30) as lease:
                inside += 1
                overlaps += inside > 1
                tokens.append(lease.token)
                await asyncio.sleep(random.uniform(0, 0.002))
                inside -= 1

    async with anyio.create_task_group() as tg:
        for client in clients:
            for _ in range(4):
                tg.start_soon(worker, client)
    assert overlaps == 0
    assert len(tokens) == 3 * 4 * 8
    assert tokens == sorted(set(tokens))  # strictly increasing in order of entry


async def test_watchdog_keeps_the_lease_alive(make_client: ClientFactory) -> None:
    holder = await make_client(watchdog_ttl=0.3)
    other = await make_client()
    async with holder.lock("job") as lease:
        await anyio.sleep(1.0)  # more than 3 leases long
        assert not lease.lost
        assert await other.lock("job").try_acquire() is None
        status = await other.status("job")
        assert status is not None
        assert status.token == lease.token


async def test_force_release_is_a_loss_for_the_holder(make_client: ClientFactory) -> None:
    holder = await make_client(watchdog_ttl=0.3)
    admin = await make_client()
    lock = holder.lock("job")
    reached_the_end = False

    async def body() -> None:
        nonlocal reached_the_end
        async with lock as lease:
            assert await admin.force_release("job")
            with anyio.fail_after(5):
                await lease.wait_lost()
            await anyio.sleep(10)  # cancelled by the loss
            reached_the_end = True

    with pytest.raises(aiodlock.LockLost):
        await body()
    assert not reached_the_end


async def test_waiter_retries_when_the_holders_lease_ends(make_client: ClientFactory) -> None:
    # Polling is slowed right down: only Busy.retry_after can explain a quick grant.
    waiter = await make_client(poll_min=30, poll_max=30)
    backend = backend_of(await make_client())
    grant = await backend.try_acquire(Request("job", "crashed", ttl=0.3), will_wait=False)
    assert isinstance(grant, Grant)
    started = time.monotonic()
    async with waiter.lock("job", timeout=10) as lease:
        assert lease.token == grant.token + 1
    assert time.monotonic() - started < 5


# -- local wake-ups ----------------------------------------------------------------------


async def _handoff_latencies(
    holder: aiodlock.Client, waiter: aiodlock.Client, rounds: int
) -> list[float]:
    """Median-able handoff times: release in one task -> acquire in a waiting task."""
    board = backend_of(waiter).board
    key = backend_of(waiter).board_key("job")
    latencies = []
    for _ in range(rounds):
        lock = holder.lock("job")
        await lock.acquire()
        got = asyncio.Event()
        acquired_at = 0.0

        async def wait_and_take(got: asyncio.Event = got) -> None:
            nonlocal acquired_at
            async with waiter.lock("job", timeout=20):
                acquired_at = time.perf_counter()
                got.set()

        task = asyncio.create_task(wait_and_take())
        try:
            assert board is not None
            await wait_for(lambda: board.count(key) == 1)
            released_at = time.perf_counter()
            await lock.release()
            await asyncio.wait_for(got.wait(), 20)
            await task
        finally:
            task.cancel()
        latencies.append(acquired_at - released_at)
    return latencies


@pytest.mark.parametrize("same_client", [True, False], ids=["same-client", "two-clients"])
async def test_same_process_handoff_is_immediate(
    make_client: ClientFactory, same_client: bool
) -> None:
    # No polling to speak of (30 s): only the local wake-up can hand over quickly.
    waiter = await make_client(poll_min=30, poll_max=30)
    holder = waiter if same_client else await make_client(poll_min=30, poll_max=30)
    latencies = await _handoff_latencies(holder, waiter, rounds=15)
    assert statistics.median(latencies) < 0.020, latencies
    assert max(latencies) < 5.0, latencies


async def test_a_release_wakes_one_local_waiter(
    make_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
    raw_db: Callable[[], sqlite3.Connection],
) -> None:
    holder = await make_client()
    waiters = await make_client(poll_min=30, poll_max=30)
    backend = backend_of(waiters)
    attempts = 0
    original = backend.try_acquire

    async def counting(request: Request, *, will_wait: bool) -> Grant | Busy:
        nonlocal attempts
        attempts += 1
        return await original(request, will_wait=will_wait)

    monkeypatch.setattr(backend, "try_acquire", counting)
    lock = holder.lock("job")
    await lock.acquire()
    winners: list[int] = []
    done = asyncio.Event()

    async def wait(i: int) -> None:
        async with waiters.lock("job", timeout=30):
            winners.append(i)
            await done.wait()

    tasks = [asyncio.create_task(wait(i)) for i in range(5)]
    try:
        board, key = backend.board, backend.board_key("job")
        assert board is not None
        # Every waiter has turned urgent (it took a place in line) and sleeps.
        conn = raw_db()
        line = "SELECT COUNT(*) FROM aiodlock_waiters"
        await wait_for(lambda: conn.execute(line).fetchone()[0] == 5)
        await wait_for(lambda: board.count(key) == 5)
        before = attempts
        await lock.release()
        await wait_for(lambda: len(winners) == 1)
        await anyio.sleep(0.2)  # a herd would show up as more attempts here
        # (one, or two: a woken waiter that is not first in line wakes the first one)
        assert attempts - before <= 2
        assert len(winners) == 1
        # Each later release wakes the next one.
        done.set()
        with anyio.fail_after(10):
            await asyncio.gather(*tasks)
        assert sorted(winners) == list(range(5))
    finally:
        for task in tasks:
            task.cancel()


async def test_the_board_is_shared_per_file_and_dropped_on_close(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    a = backend_of(await make_client())
    b = backend_of(await make_client())
    c = backend_of(await make_client(f"sqlite:///{tmp_path}/other.db"))
    assert a.board is b.board
    assert a.board is not c.board
    board = a.board
    await a.aclose()
    assert b.board is board  # b still uses it
    await b.aclose()
    await c.aclose()
    # the last backend of the file left: the next one starts a new board (none was kept)
    d = backend_of(await make_client())
    assert d.board is not None
    assert d.board is not board


def test_a_release_in_another_loop_of_the_process_wakes_the_waiter_at_once(
    tmp_path: Path,
) -> None:
    """Two clients of one file in two threads (an event loop each): the releaser's backend
    rings the waiter's loop, so the waiter, whose polls are 2.5-5 s apart, goes at once."""
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    held, waiting = threading.Event(), threading.Event()
    times: dict[str, float] = {}

    async def holder() -> None:
        async with aiodlock.connect(url) as client, client.lock("threads"):
            held.set()
            assert await asyncio.to_thread(waiting.wait, 30)
            times["released"] = time.monotonic()

    async def waiter() -> None:
        async with aiodlock.connect(url, poll_min=5.0, poll_max=5.0) as client:
            assert await asyncio.to_thread(held.wait, 30)
            task = asyncio.create_task(client.lock("threads", owner="w").acquire())
            await asyncio.sleep(0.3)  # (past its first attempt: asleep for 2.5-5 s)
            assert not task.done()
            waiting.set()
            await asyncio.wait_for(task, 30)
            times["acquired"] = time.monotonic()
            await client.lock("threads", owner="w").release()

    in_threads(holder(), waiter())
    assert times["acquired"] - times["released"] < 1.0, times


# -- cancellation --------------------------------------------------------------------------


async def test_cancelled_waiter_leaves_no_row(make_client: ClientFactory, raw_db: RawDB) -> None:
    holder = await make_client()
    waiter = await make_client(poll_max=0.01)
    lock = holder.lock("job")
    lease = await lock.acquire()
    task = asyncio.create_task(waiter.lock("job").acquire())
    board, key = backend_of(waiter).board, backend_of(waiter).board_key("job")
    assert board is not None
    await wait_for(lambda: board.count(key) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r[2] for r in rows(raw_db)] == [lease.owner]
    await lock.release()
    assert rows(raw_db) == []
    assert await waiter.status("job") is None


async def test_cancellation_at_random_points_leaves_nothing_behind(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    clients = [await make_client(poll_max=0.005) for _ in range(2)]
    started = asyncio.Event()

    async def hold(client: aiodlock.Client) -> None:
        async with client.lock("job"):
            started.set()
            await anyio.sleep(3600)

    cancelled = 0
    for i in range(60):
        tasks = [asyncio.create_task(hold(c)) for c in clients]
        await asyncio.sleep(random.uniform(0, 0.004) if i % 2 else 0)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                cancelled += 1
    assert cancelled == 120
    assert rows(raw_db) == []
    for client in clients:
        assert await client.status("job") is None
        # and the connection is still usable after all those abandoned calls
        async with client.lock("job", timeout=5):
            pass


# -- errors ----------------------------------------------------------------------------------


async def test_a_locked_database_raises_backend_timeout(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    client = await make_client(busy_timeout=0.2, op_timeout=5)
    blocker = raw_db()
    blocker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
    started = time.monotonic()
    with pytest.raises(aiodlock.BackendTimeout) as info:
        await client.lock("job").acquire(timeout=0)
    assert time.monotonic() - started < 3
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert "busy_timeout" in str(info.value)
    assert await client.status("job") is None  # reads still work in WAL mode
    blocker.execute("ROLLBACK")
    async with client.lock("job", timeout=5) as lease:  # usable again
        assert lease.token == 1


async def test_cancelling_a_call_stuck_on_a_locked_database(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    client = await make_client(op_timeout=30)
    blocker = raw_db()
    blocker.execute("BEGIN IMMEDIATE")
    task = asyncio.create_task(client.lock("job").acquire())
    await asyncio.sleep(0.2)  # the attempt is now waiting for the write lock
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5  # the caller does not wait for the database
    blocker.execute("ROLLBACK")
    assert rows(raw_db) == []
    async with client.lock("job", timeout=5) as lease:
        assert lease.token == 1


async def test_each_call_is_bounded_by_op_timeout(
    make_client: ClientFactory, raw_db: RawDB
) -> None:
    client = await make_client(op_timeout=0.3)
    blocker = raw_db()
    blocker.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    with pytest.raises(aiodlock.BackendTimeout):
        await backend_of(client).try_acquire(Request("job", "me", 5), will_wait=False)
    assert time.monotonic() - started < 3
    blocker.execute("ROLLBACK")
    assert isinstance(
        await backend_of(client).try_acquire(Request("job", "me", 5), will_wait=False), Grant
    )


async def test_calls_on_a_closed_backend_raise_backend_error(make_client: ClientFactory) -> None:
    client = await make_client()
    backend = backend_of(client)
    await backend.aclose()
    await backend.aclose()  # idempotent
    with pytest.raises(aiodlock.BackendError):
        await backend.status("job")


async def test_many_clients_open_a_new_file_at_once(make_client: ClientFactory) -> None:
    clients = await asyncio.gather(*(make_client() for _ in range(8)))
    assert len({backend_of(c).board is not None for c in clients}) == 1
    async with clients[0].lock("job") as lease:
        assert lease.token == 1
