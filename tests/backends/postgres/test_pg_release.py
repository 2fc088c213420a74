"""The advisory strategy's release: a lock taken while somebody was in line is released by
one statement that unlocks and calls the first client in line (a second follows only when
that statement's snapshot missed a client in line); an uncontended one reads no table."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, eventually

from .conftest import RawFactory
from .pg_helpers import backend_of, line, mark


def _count_statements(client: aiodlock.Client, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The answers of the holder session's statements from now on, in order (a keep-alive's
    ``SELECT 1``, should one come between, is left out)."""
    holder = backend_of(client).holder
    answers: list[Any] = []
    real = holder.call

    async def call(conn: asyncpg.Connection, step: Any, timeout: float = 0) -> Any:
        answer = await real(conn, step, timeout)
        if answer != 1:
            answers.append(answer)
        return answer

    monkeypatch.setattr(holder, "call", call)
    return answers


async def _take_after_waiting(
    make_client: ClientFactory, conn: asyncpg.Connection, name: str
) -> aiodlock.Client:
    """A client that holds ``name`` (taken by this task) after waiting in its line."""
    before, client = await make_client(), await make_client(poll_interval=HANG)
    first = before.lock(name, owner="before")
    await first.acquire()
    key = backend_of(client).key(name)

    async def release_when_in_line() -> None:
        await eventually(lambda: _line_is(conn, client, key, 1), what="the client in line")
        await first.release()

    releasing = asyncio.create_task(release_when_in_line())
    await client.lock(name).acquire(timeout=HANG)
    await releasing
    assert backend_of(client)._held[key].data.contended
    # (its place in line goes in the background: gone before the test goes on)
    await eventually(lambda: _line_is(conn, client, key, 0), what="the line left")
    return client


async def test_an_uncontended_release_is_one_statement_that_reads_no_table(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await make_client()
    lock = client.lock("alone")
    answers = _count_statements(client, monkeypatch)
    await lock.acquire()
    await lock.release()
    assert len(answers) == 2
    assert tuple(answers[1]) == (True, False)  # (unlocked; nobody holds the line's mark)


async def test_a_release_after_waiting_calls_the_next_client_in_the_same_statement(
    make_client: ClientFactory, raw: RawFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = await raw()
    holder = await _take_after_waiting(make_client, conn, "one")
    waiter = await make_client(poll_interval=HANG)  # (only a NOTIFY wakes it in time)
    key = backend_of(holder).key("one")

    async def take() -> None:
        async with waiter.lock("one", timeout=HANG):
            pass

    taker = asyncio.create_task(take())
    await eventually(lambda: _line_is(conn, holder, key, 1), what="the waiter in line")
    answers = _count_statements(holder, monkeypatch)
    await holder.lock("one").release()
    assert [tuple(a) for a in answers] == [(True, 1)]  # unlocked and called, one round trip
    await asyncio.wait_for(taker, HANG / 3)
    assert backend_of(waiter).listener.woke == 1


async def test_a_release_calls_the_first_live_client_past_rows_of_ended_sessions(
    make_client: ClientFactory, raw: RawFactory
) -> None:
    conn = await raw()
    holder = await _take_after_waiting(make_client, conn, "past")
    waiter = await make_client(poll_interval=HANG)
    backend = backend_of(holder)
    key = backend.key("past")

    async def take() -> None:
        async with waiter.lock("past", timeout=HANG):
            pass

    taker = asyncio.create_task(take())
    await eventually(lambda: _line_is(conn, holder, key, 1), what="the waiter in line")
    # Rows of sessions that have ended, first in line by far (a joining client purges them:
    # these come after the waiter joined, as a client killed meanwhile leaves its row).
    table = f'"{backend.table}_waiters"'
    insert = f"INSERT INTO {table} (key, pid, since, urgent_since) VALUES ($1, $2, $3, $3)"
    long_ago = await conn.fetchval("SELECT now() - interval '1 hour'")
    for dead in (2**31 - 1, 2**31 - 2):  # (no such server processes)
        await conn.execute(insert, key, dead, long_ago)
    await holder.lock("past").release()
    await asyncio.wait_for(taker, HANG / 3)  # (called: its poll is HANG seconds away)
    assert backend_of(waiter).listener.woke == 1
    await conn.execute(f"DELETE FROM {table} WHERE key = $1", key)


async def test_a_client_that_joins_the_line_as_the_release_begins_is_still_called(
    make_client: ClientFactory, raw: RawFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = await _take_after_waiting(make_client, await raw(), "late")
    backend = backend_of(holder)
    key = backend.key("late")
    # A session joins the line as a client does (the mark, then its row), but its row commits
    # only after the release's statement has taken its snapshot: that statement sees the
    # mark held and no row, and the release asks again in a statement of its own.
    late = await raw()
    heard: asyncio.Queue[str] = asyncio.Queue()
    own = f"{backend.channel}_{late.get_server_pid()}"
    await late.add_listener(own, lambda *args: heard.put_nowait(args[3]))
    joining = late.transaction()
    await joining.start()
    await mark(late, key)
    table = f'"{backend.table}_waiters"'
    await late.execute(f"INSERT INTO {table} (key, pid) VALUES ($1, pg_backend_pid())", key)
    answers = _count_statements(holder, monkeypatch)
    real = backend.holder.call

    async def call(conn: asyncpg.Connection, step: Any, timeout: float = 0) -> Any:
        answer = await real(conn, step, timeout)
        if len(answers) == 1:
            await joining.commit()  # (between the release's two statements)
        return answer

    monkeypatch.setattr(backend.holder, "call", call)
    await holder.lock("late").release()
    assert tuple(answers[0]) == (True, 0)  # the mark, but no row in its snapshot
    assert len(answers) == 2
    assert await asyncio.wait_for(heard.get(), HANG) == str(key)
    await mark(late, key, held=False)
    await late.execute(f"DELETE FROM {table} WHERE key = $1", key)


async def _line_is(conn: asyncpg.Connection, client: aiodlock.Client, key: int, n: int) -> bool:
    return len(await line(conn, client, key)) == n


async def test_a_granted_waiter_leaves_its_line_off_the_hand_off_path(
    make_client: ClientFactory, raw: RawFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's place in line goes after its grant, in the background: the acquire returns
    without waiting for that round trip, and the release waits until the place is gone, so
    that its call reaches the next client in line (no poll within the test) and not itself."""
    conn = await raw()
    holder = await make_client()
    waiter, third = (
        await make_client(poll_interval=HANG * 10),
        await make_client(poll_interval=HANG * 10),
    )
    listener = backend_of(waiter).listener
    key = backend_of(waiter).key("bg")
    gate = asyncio.Event()
    real = listener._leave_line

    async def held_up(session: asyncpg.Connection, key: int, called: bool) -> None:
        await gate.wait()
        await real(session, key, called)

    monkeypatch.setattr(listener, "_leave_line", held_up)
    first = holder.lock("bg")
    await first.acquire()
    got, done = asyncio.Event(), asyncio.Event()

    async def take(client: aiodlock.Client, entered: asyncio.Event) -> None:
        async with client.lock("bg", timeout=HANG):
            entered.set()
            await done.wait()

    taking = asyncio.create_task(take(waiter, got))
    await eventually(lambda: listener.listening_for(key), what="the waiter in line")
    await first.release()
    await asyncio.wait_for(got.wait(), HANG)  # (taken while its leave is held up)
    assert await line(conn, waiter, key) == [listener.pid]
    third_got = asyncio.Event()
    next_one = asyncio.create_task(take(third, third_got))
    await eventually(
        lambda: backend_of(third).listener.listening_for(key), what="the third client in line"
    )
    done.set()
    await asyncio.sleep(0.2)
    assert not taking.done()  # (its release waits for the leave)
    assert not third_got.is_set()
    gate.set()
    await asyncio.wait_for(taking, HANG)
    await asyncio.wait_for(third_got.wait(), HANG)  # (called by that release)
    assert listener.heard == 1  # (its own release did not call it)
    await asyncio.wait_for(next_one, HANG)
