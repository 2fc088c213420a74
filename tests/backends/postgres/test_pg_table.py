"""``strategy=table``: the lock table on a real PostgreSQL inside one process: exclusion and
tokens, reentrancy, status, awkward names, FIFO for fair locks woken by NOTIFY (one wake-up
per release: test_pg_locking.py, both strategies), cancellation at any point, idle sessions
the server ended, the LISTEN session opened again (both strategies)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Sized

import asyncpg
import pytest

import aiodlock
from aiodlock._types import Busy, Grant, Request, client_of
from aiodlock.backends.postgres import _statements as sql
from aiodlock.backends.postgres.table import PostgresTableBackend
from tests.helpers import HANG, ClientFactory, eventually, take_turns
from tests.servers import PostgresServer

from .conftest import RawFactory


@pytest.fixture
def lock_url(postgres_server: PostgresServer) -> str:
    return postgres_server.url + "?strategy=table"


@pytest.fixture
async def other(make_client: ClientFactory) -> aiodlock.Client:
    """A second client of the same server and namespace: another process, in effect."""
    return await make_client()


def table_of(client: aiodlock.Client) -> PostgresTableBackend:
    backend = client.backend
    assert isinstance(backend, PostgresTableBackend)
    return backend


async def rows(conn: asyncpg.Connection, namespace: str) -> list[tuple[bytes, str, int]]:
    """The lock rows of ``namespace``: (name, owner, token)."""
    found = await conn.fetch(
        "SELECT name, owner, token FROM aiodlock_locks WHERE namespace = $1 ORDER BY name",
        namespace,
    )
    return [(r["name"], r["owner"], r["token"]) for r in found]


async def line(conn: asyncpg.Connection, namespace: str) -> list[str]:
    """The owners in the line of waiters of ``namespace``, first first."""
    found = await conn.fetch(
        "SELECT owner FROM aiodlock_waiters WHERE namespace = $1 ORDER BY id", namespace
    )
    return [r["owner"] for r in found]


async def listeners(conn: asyncpg.Connection, key: int) -> list[int]:
    """The LISTEN sessions waiting for ``key`` (a row of a session that has ended counts as
    gone, as it does for the backends: a join cut short ends its session)."""
    found = await conn.fetch(
        "SELECT pid FROM aiodlock_listeners w WHERE key = $1"
        " AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)",
        key,
    )
    return [r["pid"] for r in found]


async def test_exclusion_and_strictly_increasing_tokens_across_tasks_and_clients(
    make_client: ClientFactory, raw: RawFactory, namespace: str
) -> None:
    clients = [await make_client(poll_interval=0.05) for _ in range(2)]
    await take_turns(clients, "shared", tasks=6, rounds=4)
    conn = await raw()
    assert await rows(conn, namespace) == []
    assert await line(conn, namespace) == []
    assert await listeners(conn, table_of(clients[0]).key("shared")) == []


async def test_reentrancy_keeps_one_row_and_one_token(
    client: aiodlock.Client, raw: RawFactory, namespace: str
) -> None:
    conn = await raw()
    lock = client.lock("re")
    async with lock as outer:
        async with lock as inner:
            assert inner.token == outer.token
            assert len(await rows(conn, namespace)) == 1
        assert len(await rows(conn, namespace)) == 1  # still held by the outer level
    assert await rows(conn, namespace) == []


async def test_status_gives_holder_token_and_time_left(
    client: aiodlock.Client, other: aiodlock.Client
) -> None:
    assert await other.status("st") is None
    async with client.lock("st", ttl=20) as lease:
        status = await other.status("st")
        assert status is not None
        assert (status.owner, status.token) == (lease.owner, lease.token)
        assert status.expires_in is not None
        assert 15 < status.expires_in <= 20
    assert await other.status("st") is None


async def test_an_expired_row_is_taken_over_once_with_the_version(client: aiodlock.Client) -> None:
    backend = table_of(client)
    first = await backend.try_acquire(Request("job", "a", 0.2), will_wait=False)
    assert isinstance(first, Grant)
    assert isinstance(await backend.try_acquire(Request("job", "b", 10), will_wait=False), Busy)
    await asyncio.sleep(0.3)  # the lease's end on the server's clock (no event to wait on)
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


async def test_one_of_many_attempts_on_a_free_name_wins(make_client: ClientFactory) -> None:
    clients = [await make_client() for _ in range(6)]
    outcomes = await asyncio.gather(
        *(table_of(c).try_acquire(Request("free", f"o{i}", 10), will_wait=False)
          for i, c in enumerate(clients))
    )  # fmt: skip
    winners = [o for o in outcomes if isinstance(o, Grant)]
    assert len(winners) == 1
    status = await clients[0].status("free")
    assert status is not None
    assert (status.owner, status.token) == (winners[0].owner, winners[0].token)


NAMES = [
    "Key",
    "key",  # compared byte for byte: two locks
    "x'); DELETE FROM aiodlock_locks; --",
    'quote"d $1 ? %s \\',
    "nul\0inside",
    "lone \ud800 surrogate",
    "\udcff",
    "🔒" * 512,  # 2048 bytes of UTF-8: the longest a name gets
]


async def test_hostile_names_are_separate_locks_stored_exactly(
    client: aiodlock.Client, other: aiodlock.Client, raw: RawFactory, namespace: str
) -> None:
    leases = [await client.lock(name).acquire(timeout=HANG) for name in NAMES]
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(set(tokens))  # (the rows' own ids)
    stored = {row[0] for row in await rows(await raw(), namespace)}
    assert stored == {name.encode("utf-8", "surrogatepass") for name in NAMES}
    for name, lease in zip(NAMES, leases, strict=True):
        assert await other.lock(name).try_acquire() is None
        status = await other.status(name)
        assert status is not None
        assert (status.name, status.owner, status.token) == (name, lease.owner, lease.token)
    for name in NAMES:
        await client.lock(name).release()
    assert await rows(await raw(), namespace) == []


async def _count(found: Awaitable[Sized], n: int) -> bool:
    return len(await found) == n


async def test_fair_locks_are_granted_in_line_order_woken_by_notify(
    make_client: ClientFactory, raw: RawFactory, namespace: str
) -> None:
    conn = await raw()
    holder = await make_client()
    clients = [await make_client(poll_interval=HANG) for _ in range(4)]
    await holder.lock("fifo").acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        async with clients[i].lock("fifo", fair=True, timeout=HANG):
            order.append(i)
            await asyncio.sleep(0.005)

    tasks = []

    async def lined_up(n: int) -> bool:
        return len(await line(conn, namespace)) == n

    for i in range(4):
        tasks.append(asyncio.create_task(wait(i)))
        await eventually(functools.partial(lined_up, i + 1), what="in line")
    key = table_of(holder).key("fifo")
    await eventually(lambda: _count(listeners(conn, key), 4), what="listening")
    await holder.lock("fifo").release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    seen = {  # (what a failure shows)
        "order": order,
        "woke": [table_of(c).listener.woke for c in clients],
        "heard": [table_of(c).listener.heard for c in clients],
    }
    assert order == [0, 1, 2, 3], seen
    assert [table_of(c).listener.woke for c in clients] == [1, 1, 1, 1], seen
    # (each release told the client of the first in line alone: nobody else heard it)
    assert [table_of(c).listener.heard for c in clients] == [1, 1, 1, 1], seen
    assert await line(conn, namespace) == []


@pytest.mark.parametrize(
    "owner", ["host-1-abc:7", "host-1-abc/job:17/a", "host-1-abc/", "host-1-abc/:/::", "x"]
)
async def test_the_servers_reading_of_an_owners_client_is_the_cores(
    raw: RawFactory, owner: str
) -> None:
    conn = await raw()
    assert await conn.fetchval(f"SELECT {sql.client_of('$1::text')}", owner) == client_of(owner)


async def test_a_row_in_line_that_names_no_client_is_still_told(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    """A client of an earlier aiodlock (its rows name no client) waiting for a name with a
    line: a release still tells it who is first (it may be its owner)."""
    holder, waiter = await make_client(), await make_client(poll_interval=HANG)
    await holder.lock("mixed").acquire()
    taker = asyncio.create_task(_take_fair(waiter, "mixed"))
    conn, old = await raw(), await raw()
    key = table_of(holder).key("mixed")
    await eventually(lambda: _count(listeners(conn, key), 1), what="the waiter listening")
    heard: asyncio.Queue[str] = asyncio.Queue()
    channel = f"{table_of(holder).channel}_{old.get_server_pid()}"
    await old.add_listener(channel, lambda *args: heard.put_nowait(args[3]))
    await old.execute(
        "INSERT INTO aiodlock_listeners (key, pid) VALUES ($1, pg_backend_pid())", key
    )
    await holder.lock("mixed").release()
    await asyncio.wait_for(taker, HANG / 3)
    said = await asyncio.wait_for(heard.get(), HANG)
    assert said.startswith(f"{key} {table_of(waiter).listener.client}")
    assert table_of(waiter).listener.heard == 1
    await old.execute("DELETE FROM aiodlock_listeners WHERE pid = pg_backend_pid()")


async def test_a_listeners_table_made_before_the_client_column_gets_it(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn = await raw()
    await conn.execute("ALTER TABLE aiodlock_listeners DROP COLUMN IF EXISTS client")
    assert not await conn.fetchval(sql.HAS_CLIENT, "aiodlock_listeners")
    client = await make_client()
    assert await conn.fetchval(sql.HAS_CLIENT, "aiodlock_listeners")
    async with client.lock("after", timeout=0):
        pass


async def _take_fair(client: aiodlock.Client, name: str) -> None:
    async with client.lock(name, fair=True, timeout=HANG):
        pass


async def test_a_call_that_missed_the_first_in_line_is_passed_on_to_it(
    make_client: ClientFactory, raw: RawFactory, namespace: str
) -> None:
    """A release read the line before the first in line's LISTEN row committed (rows commit
    in another order than their ids), so it called nobody, or a client behind.  The next
    attempt of a waiter behind finds the name kept for the first in line, and calls its
    client, which takes the name at once (no poll within the test)."""
    conn = await raw()
    holder = await make_client()
    first, second = [await make_client(poll_interval=HANG * 10) for _ in range(2)]
    await holder.lock("missed").acquire()
    key = table_of(holder).key("missed")
    taking = asyncio.create_task(_take_fair(first, "missed"))
    await eventually(lambda: _count(line(conn, namespace), 1), what="the first in line")
    behind = asyncio.create_task(_take_fair(second, "missed"))
    await eventually(lambda: _count(line(conn, namespace), 2), what="the second in line")
    await eventually(lambda: _count(listeners(conn, key), 2), what="both listening")
    pid = table_of(first).listener.pid
    row = await conn.fetchrow(
        "DELETE FROM aiodlock_listeners WHERE key = $1 AND pid = $2 RETURNING *", key, pid
    )
    await holder.lock("missed").release()  # (it finds no session of the first's client)
    await conn.execute(
        "INSERT INTO aiodlock_listeners (key, pid, since, client) VALUES ($1, $2, $3, $4)",
        key,
        pid,
        row["since"],
        row["client"],
    )
    assert not taking.done()
    table_of(second).listener.board.wake_one(str(key))  # (its next attempt)
    await asyncio.wait_for(taking, HANG)
    await asyncio.wait_for(behind, HANG)  # (called by the first's release)
    assert await line(conn, namespace) == []


@pytest.mark.parametrize("delay", [0.0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.02])
async def test_cancellation_at_any_point_leaves_nothing_behind(
    make_client: ClientFactory, raw: RawFactory, namespace: str, delay: float
) -> None:
    conn = await raw()
    a, blocker = await make_client(), await make_client()
    await blocker.lock("cancel").acquire()
    free_too = asyncio.create_task(a.lock("free").acquire())
    fair = asyncio.create_task(a.lock("cancel", fair=True).acquire(timeout=HANG))
    plain = asyncio.create_task(a.lock("cancel").acquire(timeout=HANG))
    await asyncio.sleep(delay)
    for task in (free_too, fair, plain):
        task.cancel()
    await asyncio.gather(free_too, fair, plain, return_exceptions=True)
    # (a "free" won before the cancellation is released by the core as its task ended)
    blocker_owner = (await blocker.status("cancel")).owner  # type: ignore[union-attr]

    async def only_the_blocker() -> bool:
        return [r[1] for r in await rows(conn, namespace)] == [blocker_owner]

    await eventually(only_the_blocker, what="the cancelled acquires left no row")
    await eventually(lambda: _count(line(conn, namespace), 0), what="no place in line")
    key = table_of(a).key("cancel")
    await eventually(lambda: _count(listeners(conn, key), 0), what="no LISTEN place")
    # The client goes on normally.
    await blocker.lock("cancel").release()
    async with a.lock("cancel", timeout=HANG), a.lock("free", timeout=HANG):
        pass


async def test_an_attempt_cut_short_cannot_commit_after_its_clean_up(
    client: aiodlock.Client, raw: RawFactory, namespace: str
) -> None:
    conn = await raw()
    # Another transaction is inserting the name's row: the attempt's INSERT waits for it.
    await conn.execute("BEGIN")
    await conn.execute(
        "INSERT INTO aiodlock_locks (namespace, name, owner, expires_at, version)"
        " VALUES ($1, $2, 'blocker', 0, 1)",
        namespace,
        b"late",
    )
    task = asyncio.create_task(client.lock("late").acquire(timeout=HANG))
    waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    await eventually(lambda: _count(conn.fetch(waiting), 1), what="the attempt waits")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # (the core's clean-up is done)
    # The attempt's statement, still waiting on the server when its connection was
    # dropped, must not go on to commit a row nobody will ever release.
    await conn.execute("ROLLBACK")
    await asyncio.sleep(0.2)
    assert await rows(conn, namespace) == []
    async with client.lock("late", timeout=HANG) as lease:
        assert [row[0] for row in await rows(conn, namespace)] == [b"late"]
        assert lease.token > 0


@pytest.mark.parametrize("owner", ["nul\0inside", "lone \udcff"])
async def test_an_owner_that_text_cannot_hold_is_a_clear_error(
    client: aiodlock.Client, raw: RawFactory, namespace: str, owner: str
) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="owner"):
        await client.lock("o", owner=owner).acquire(timeout=1)
    assert await rows(await raw(), namespace) == []
    async with client.lock("o", owner="fine"):
        pass


async def test_waiters_hold_no_connection_while_they_sleep(make_client: ClientFactory) -> None:
    holder = await make_client()
    waiting = await make_client(pool_size=2, poll_interval=0.05)
    lease = await holder.lock("pool").acquire()
    done: list[int] = []

    async def wait(i: int) -> None:
        async with waiting.lock("pool", timeout=HANG):
            done.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(20)]
    await asyncio.sleep(0.2)
    # 20 waiters on a pool of 2: a call still gets a connection at once.
    async with asyncio.timeout(2.0):
        status = await waiting.status("pool")
    assert status is not None
    assert status.owner == lease.owner
    await holder.lock("pool").release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    assert sorted(done) == list(range(20))


async def test_a_call_cut_short_discards_its_connection(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    # (a release is not cancelled with its task: it ends at op_timeout, and so is cut short)
    client = await make_client(op_timeout=0.5)
    conn = await raw()
    await client.lock("d", owner="k").acquire()
    # Another transaction locks the row: the release waits for it, and is cancelled.
    await conn.execute("BEGIN")
    await conn.fetch("SELECT 1 FROM aiodlock_locks WHERE name = $1 FOR UPDATE", b"d")
    task = asyncio.create_task(client.lock("d", owner="k").release())
    waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    await eventually(lambda: _count(conn.fetch(waiting), 1), what="the release waits")
    pid = await conn.fetchval(waiting)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, aiodlock.BackendError):
        await task
    await conn.execute("ROLLBACK")
    # That session is never used again: the server ends it (its socket is closed).
    alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"
    await eventually(lambda: _zero(conn.fetchval(alive, pid)), what="the session ended")
    async with client.lock("e", timeout=HANG):
        pass


async def _zero(value: Awaitable[object]) -> bool:
    return await value == 0


async def test_idle_sessions_the_server_ended_are_replaced_without_an_error(
    client: aiodlock.Client, raw: RawFactory
) -> None:
    pool = table_of(client)._pool
    assert pool is not None
    conn = await raw()
    end = "SELECT count(pg_terminate_backend(p)) FROM unnest($1::int[]) p"
    for round in range(3):
        async with client.lock("a"), client.lock("b"), client.lock("c"):
            pass  # (idle sessions in the pool)
        ended = {session.identity[0] for session in pool._idle}
        assert await conn.fetchval(end, list(ended))
        # At once: the client may not know yet, and run a statement on a dead session; it
        # runs it again on a new one, and no idle session it ended is lent again.
        async with client.lock(f"after-{round}", timeout=HANG):
            pass
        assert not ended & {session.identity[0] for session in pool._idle}


@pytest.mark.parametrize("strategy", ["advisory", "table"])
async def test_the_listen_session_is_opened_again_when_it_dies(
    make_client: ClientFactory, raw: RawFactory, strategy: str, postgres_server: PostgresServer
) -> None:
    url = f"{postgres_server.url}?strategy={strategy}"
    holder = await make_client(url)
    waiting = await make_client(url, poll_interval=HANG)  # (no fallback poll: NOTIFY only)
    ear = waiting.backend.listener  # type: ignore[attr-defined]
    key = waiting.backend.key("re")  # type: ignore[attr-defined]
    await holder.lock("re").acquire()
    task = asyncio.create_task(waiting.lock("re").acquire(timeout=HANG))
    await eventually(lambda: ear.listening_for(key), what="listening")
    pid = ear.pid
    conn = await raw()
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
    # Nobody asks the client for anything: it LISTENs again on its own, and takes its
    # place in line again.
    await eventually(lambda: ear.listening_for(key) and ear.pid != pid, what="listening again")
    await asyncio.sleep(0.05)
    assert not task.done()
    await holder.lock("re").release()
    await asyncio.wait_for(task, HANG / 3)
    assert ear.woke == 1  # (by the NOTIFY the new session heard)
