"""Advisory locks: exclusion between the tasks of one client (advisory locks stack per
session) and between clients, the tokens, one wake-up per release (both strategies),
cancellation, status."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import asyncpg
import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, eventually, take_turns
from tests.servers import PostgresServer

from .conftest import RawFactory
from .pg_helpers import backend_of, holders, line, marked_by


async def test_two_tasks_of_one_client_exclude_each_other(
    client: aiodlock.Client, raw: RawFactory
) -> None:
    conn = await raw()
    key = backend_of(client).key("shared")
    first = await client.lock("shared").acquire()

    async def other_task() -> aiodlock.Lease | None:
        return await client.lock("shared").try_acquire()

    # The other task shares the holder session, where pg_try_advisory_lock would succeed
    # (it stacks): the client itself must say no.
    assert await asyncio.create_task(other_task()) is None
    with pytest.raises(aiodlock.LockTimeout):
        await asyncio.create_task(client.lock("shared").acquire(timeout=0.2))
    assert await holders(conn, key) == [backend_of(client).holder.pid]
    await client.lock("shared").release()
    assert await holders(conn, key) == []  # not stacked: one unlock freed it
    del first


async def test_many_tasks_of_one_client_and_another_client_take_turns(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    a, b = await make_client(), await make_client()
    await take_turns([a, b], "turns", tasks=8, rounds=4)
    assert await holders(await raw(), backend_of(a).key("turns")) == []


@pytest.mark.parametrize("strategy", ["advisory", "table"])
async def test_one_client_is_woken_per_release(
    make_client: ClientFactory, raw: RawFactory, postgres_server: PostgresServer, strategy: str
) -> None:
    conn = await raw()
    url = f"{postgres_server.url}?strategy={strategy}"
    holder = await make_client(url)
    # (no fallback poll during the test: only NOTIFYs wake)
    waiters = [await make_client(url, poll_interval=HANG) for _ in range(4)]
    other_name = await make_client(url, poll_interval=HANG)
    key = holder.backend.key("herd")  # type: ignore[attr-defined]
    await holder.lock("herd").acquire()
    await other_name.lock("elsewhere").acquire()
    order: list[aiodlock.Client] = []

    async def wait(client: aiodlock.Client) -> None:
        async with client.lock("herd", timeout=HANG):
            order.append(client)
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(wait(c)) for c in waiters]
    bystander = asyncio.create_task(other_name.lock("elsewhere").acquire(timeout=HANG))
    await eventually(lambda: _lined_up(conn, holder, key, 4), what="4 waiters in line")
    if strategy == "advisory":
        # (a waiter turns urgent 10 ms into its wait, with an attempt of its own: one made
        # while the lock is free may take it from the client the release called, who then
        # waits again; released once every waiter is urgent, the order is the line's)
        table = f"{holder.backend.table}_waiters"  # type: ignore[attr-defined]
        marked = f'SELECT count(*) FROM "{table}" WHERE key = $1 AND urgent_since IS NOT NULL'
        await eventually(
            lambda: _fetch_is(conn, marked, (key,), 4), what="4 urgent waiters in line"
        )
        # (each client in line holds the key's line mark, by which a release knows that
        # somebody waits without reading the line)
        pids = sorted(c.backend.listener.pid for c in waiters)  # type: ignore[attr-defined]
        assert await marked_by(conn, key) == pids
    else:
        # (the same with the table's line: a waiter turns urgent 10 ms into its wait and
        # takes its place in the line with an attempt of its own; released before all four
        # have, the lock may go to such an attempt instead of the client the release called,
        # who then waits again: a second wake-up for it, none for the other)
        in_line = "SELECT count(*) FROM aiodlock_waiters WHERE namespace = $1 AND name = $2"
        args = (holder.config.namespace, b"herd")
        await eventually(lambda: _fetch_is(conn, in_line, args, 4), what="4 waiters in line")
    await holder.lock("herd").release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    # 4 releases (the holder's, then 3 waiters'): each woke exactly one waiter, in the
    # order they lined up; nobody else was woken.
    listeners = [c.backend.listener for c in waiters]  # type: ignore[attr-defined]
    seen = {  # (what a failure shows: who was woken, who heard what, in which order)
        "woke": [x.woke for x in listeners],
        "heard": [x.heard for x in listeners],
        "order": [waiters.index(c) for c in order],
    }
    assert [x.woke for x in listeners] == [1, 1, 1, 1], seen
    # Each NOTIFY went to the one client it called: nobody else even heard it.  (With the
    # table's line, the client of the owner first in line is told that owner.)
    assert [x.heard for x in listeners] == [1, 1, 1, 1], seen
    assert len(set(order)) == 4
    assert await line(conn, holder, key) == []
    assert await marked_by(conn, key) == []  # (given back with the rows)
    assert not bystander.done()  # a waiter of another name slept through all of it
    assert other_name.backend.listener.heard == 0  # type: ignore[attr-defined]
    bystander.cancel()
    with contextlib.suppress(asyncio.CancelledError, aiodlock.LockError):
        await bystander


async def _fetch_is(conn: object, query: str, args: tuple[object, ...], expected: int) -> bool:
    return await conn.fetchval(query, *args) == expected  # type: ignore[attr-defined, no-any-return]


async def _take(client: aiodlock.Client, name: str) -> None:
    async with client.lock(name, timeout=HANG):
        pass


async def _none(conn: object, key: int) -> bool:
    return await holders(conn, key) == []  # type: ignore[arg-type]


async def _unmarked(conn: object, key: int) -> bool:
    return await marked_by(conn, key) == []  # type: ignore[arg-type]


async def _lined_up(conn: object, client: aiodlock.Client, key: int, n: int) -> bool:
    return len(await line(conn, client, key)) == n  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [0.0, 0.0003, 0.001, 0.002, 0.004, 0.008, 0.02])
async def test_cancellation_at_any_point_leaves_nothing_behind(
    make_client: ClientFactory, raw: RawFactory, delay: float
) -> None:
    conn = await raw()
    a, blocker = await make_client(), await make_client()
    key = backend_of(a).key("cancel")
    await blocker.lock("cancel").acquire()
    free_too = asyncio.create_task(a.lock("free").acquire())
    waiting = asyncio.create_task(a.lock("cancel").acquire(timeout=HANG))
    await asyncio.sleep(delay)
    free_too.cancel()
    waiting.cancel()
    await asyncio.gather(free_too, waiting, return_exceptions=True)
    # (a "free" won before the cancellation is released by the core as its task ended)
    pid = backend_of(a).holder.pid
    assert pid not in await holders(conn, key)
    free_key = backend_of(a).key("free")
    await eventually(lambda: _none(conn, free_key), what="'free' released")
    # (a join cut short ends its LISTEN session: its row is gone once the session is)
    await eventually(lambda: _lined_up(conn, a, key, 0), what="no place left in line")
    await eventually(lambda: _unmarked(conn, key), what="no line mark left")
    # The client goes on normally.
    await blocker.lock("cancel").release()
    async with a.lock("cancel", timeout=HANG), a.lock("free", timeout=HANG):
        pass


@pytest.mark.parametrize(
    "name",
    [
        "x'); SELECT pg_advisory_unlock_all(); --",
        'quote"d',
        "nul\x00byte",
        "\udcff",
        "é" * 3000,
        "",
    ],
    ids=["injection", "quote", "nul", "surrogate", "long", "empty"],
)
async def test_hostile_names(make_client: ClientFactory, name: str) -> None:
    a, b = await make_client(), await make_client()
    try:
        lock = a.lock(name)
    except aiodlock.ConfigurationError:
        return  # (the core refuses it for every backend)
    async with lock as lease:
        assert await b.lock(name).try_acquire() is None
        status = await b.lock(name).status()
        assert status is not None
        assert (status.name, status.owner, status.token) == (name, lease.owner, lease.token)
    assert await b.lock(name).status() is None


async def test_the_longest_namespace_has_a_valid_channel(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    namespace = "a.b:c-D_" * 8  # (64 characters, the most the core allows)
    a = await make_client(namespace=namespace, poll_interval=HANG)
    b = await make_client(namespace=namespace, poll_interval=HANG)
    conn = await raw()
    key = backend_of(b).key("n")
    async with a.lock("n"):
        assert await b.lock("n").try_acquire() is None
        waiter = asyncio.create_task(_take(b, "n"))
        await eventually(lambda: _lined_up(conn, b, key, 1))
        # (the waiter turns urgent 10 ms into its wait, with an attempt of its own: made
        # just as the lock is released, it takes the lock unwoken; release after it)
        table = f"{backend_of(b).table}_waiters"
        marked = f'SELECT count(*) FROM "{table}" WHERE key = $1 AND urgent_since IS NOT NULL'
        await eventually(lambda: _fetch_is(conn, marked, (key,), 1), what="the waiter urgent")
    await asyncio.wait_for(waiter, HANG)
    assert backend_of(b).listener.woke == 1


async def test_status_of_a_lock_taken_outside_aiodlock(
    client: aiodlock.Client, raw: RawFactory
) -> None:
    conn = await raw()
    async with client.lock("foreign"):  # (the counter row names this owner from now on)
        pass
    await conn.fetchval("SELECT pg_advisory_lock($1)", backend_of(client).key("foreign"))
    status = await client.lock("foreign").status()
    assert status is not None
    assert status.owner == f"(PostgreSQL session {conn.get_server_pid()})"
    assert await client.lock("foreign").try_acquire() is None


async def test_force_release_ends_the_holding_session(make_client: ClientFactory) -> None:
    a, admin = await make_client(), await make_client()
    lost = asyncio.Event()
    async with a.lock("one", on_lost=lambda _: lost.set()) as one:
        pid = backend_of(a).holder.pid
        assert await admin.force_release("one")
        await asyncio.wait_for(lost.wait(), HANG)
        assert one.lost
    # The client reconnects on its next use.
    async with a.lock("two") as two:
        assert not two.lost
        assert backend_of(a).holder.pid not in (None, pid)


async def test_tokens_survive_a_new_holder_session(make_client: ClientFactory) -> None:
    a = await make_client()
    tokens = []
    for _ in range(3):
        async with a.lock("tok") as lease:
            tokens.append(lease.token)
        backend_of(a).holder.discard(backend_of(a).holder.conn, "test")  # type: ignore[arg-type]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3
    assert all(b - a == 1 for a, b in itertools.pairwise(tokens))


async def _two_in_line(
    make_client: ClientFactory, raw: RawFactory, name: str
) -> tuple[
    asyncpg.Connection,
    aiodlock.Client,
    aiodlock.Client,
    aiodlock.Client,
    int,
    asyncio.Task[Any],
    asyncio.Task[Any],
]:
    """``name`` held by one client, and a task of two more clients in its line, in order
    (``first``'s ``gone``, then ``second``'s ``taker``; their fallback polls HANG away); a
    raw connection to look at the line."""
    conn = await raw()
    holder = await make_client()
    first = await make_client(poll_interval=HANG)
    second = await make_client(poll_interval=HANG)
    key = backend_of(holder).key(name)
    await holder.lock(name).acquire()
    gone = asyncio.create_task(_take(first, name))
    await eventually(lambda: _lined_up(conn, holder, key, 1))
    taker = asyncio.create_task(_take(second, name))
    await eventually(lambda: _lined_up(conn, holder, key, 2))
    return conn, holder, first, second, key, gone, taker


async def test_a_called_client_that_leaves_calls_the_next_one(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn, holder, first, second, key, gone, taker = await _two_in_line(make_client, raw, "pass")
    # The first client is called, and its waiter is cancelled before it can ask again.
    listen = backend_of(first).listener.conn
    assert listen is not None
    own = f"{backend_of(first).channel}_{listen.get_server_pid()}"
    await listen.add_listener(own, lambda *_: gone.cancel())
    await holder.lock("pass").release()
    # Its unused wake-up goes to the next client in line, which takes the lock at once
    # (its fallback poll is HANG seconds away).
    await asyncio.wait_for(taker, HANG / 3)
    # (its task may still be leaving the line: the pass-on's answer comes after the NOTIFY)
    await asyncio.wait([gone], timeout=HANG)
    assert gone.cancelled()
    assert backend_of(second).listener.woke == 1
    assert await line(conn, holder, key) == []


async def test_a_call_heard_after_the_waiter_left_goes_to_the_next_client(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    """A call can reach a client whose waiter has just left the line (another client's
    attempt, barred by its place, found the lock free and called it): the client passes it
    on to the next in line instead of dropping it (that one would sleep until its poll)."""
    conn, holder, first, second, key, gone, taker = await _two_in_line(make_client, raw, "fwd")
    table = f"{backend_of(holder).table}_waiters"
    marked = f'SELECT count(*) FROM "{table}" WHERE key = $1 AND urgent_since IS NOT NULL'
    await eventually(lambda: _fetch_is(conn, marked, (key,), 2), what="both waiters urgent")
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    await eventually(lambda: _lined_up(conn, holder, key, 1), what="the first left the line")
    listener = backend_of(first).listener
    assert listener.conn is not None
    own = f"{backend_of(first).channel}_{listener.conn.get_server_pid()}"
    await conn.execute("SELECT pg_notify($1, $2)", own, str(key))  # (the late call)
    await eventually(lambda: backend_of(second).listener.woke == 1, what="the call passed on")
    assert listener.heard == 1
    assert not taker.done()  # (it asked, and waits again: the holder still holds the lock)
    await holder.lock("fwd").release()
    await asyncio.wait_for(taker, HANG)
