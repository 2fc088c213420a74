"""A client's LISTEN session closes ``listen_idle`` seconds after its last waiter left (every
NOTIFY of a database wakes every session that LISTENs in it), and the next wait listens
again and is woken by a release, not by its poll."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import asyncpg
import pytest

import aiodlock
from tests.helpers import HANG, ClientFactory, eventually

from .conftest import RawFactory

#: A poll that never comes within a test: a wait that ends was woken by a NOTIFY.
NO_POLL = 3600.0

pytestmark = pytest.mark.parametrize("strategy", ["advisory", "table"])


def listener_of(client: aiodlock.Client) -> Any:
    return client.backend.listener  # type: ignore[attr-defined]


async def _alive(conn: asyncpg.Connection, pid: int) -> bool:
    found = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
    return bool(found)


async def _gone(conn: asyncpg.Connection, pid: int) -> bool:
    return not await _alive(conn, pid)


async def _hand_over(holder: aiodlock.Client, waiter: aiodlock.Client, name: str) -> int:
    """``holder`` takes ``name``, a task of ``waiter`` waits for it (no poll), the holder
    releases, the waiter takes it and releases; the pid of the waiter's LISTEN session."""
    lock = holder.lock(name)
    await lock.acquire()
    waiting = asyncio.create_task(_take(waiter, name))
    await eventually(lambda: listener_of(waiter).listening_for(_key(waiter, name)))
    pid: int = listener_of(waiter).pid
    await lock.release()
    await waiting
    return pid


async def _take(client: aiodlock.Client, name: str) -> None:
    """Wait for ``name`` (up to HANG), take it and release it."""
    async with client.lock(name, timeout=HANG) as lease:
        assert not lease.lost


async def _clients(
    make_client: ClientFactory, strategy: str, listen_idle: float
) -> tuple[aiodlock.Client, aiodlock.Client]:
    """A holder, and a waiter whose LISTEN session closes after ``listen_idle`` seconds (and
    that never polls within a test)."""
    holder = await make_client(strategy=strategy)
    waiter = await make_client(strategy=strategy, listen_idle=listen_idle, poll_interval=NO_POLL)
    return holder, waiter


def _key(client: aiodlock.Client, name: str) -> int:
    return client.backend.key(name)  # type: ignore[attr-defined, no-any-return]


async def test_an_idle_listen_session_closes_and_the_next_wait_listens_again(
    make_client: ClientFactory, raw: RawFactory, strategy: str
) -> None:
    conn = await raw()
    holder, waiter = await _clients(make_client, strategy, 0.3)
    first = await _hand_over(holder, waiter, "idle")
    assert await _alive(conn, first)
    await eventually(lambda: listener_of(waiter).conn is None, what="the session closed")
    await eventually(lambda: _gone(conn, first), what="the session gone from the server")
    # The next wait opens a new session, and the release wakes it.
    second = await _hand_over(holder, waiter, "idle")
    assert second != first


async def test_a_session_with_a_waiter_stays_open(
    make_client: ClientFactory, raw: RawFactory, strategy: str
) -> None:
    conn = await raw()
    holder, waiter = await _clients(make_client, strategy, 0.05)
    lock = holder.lock("kept")
    await lock.acquire()
    waiting = asyncio.create_task(_take(waiter, "kept"))
    await eventually(lambda: listener_of(waiter).listening_for(_key(waiter, "kept")))
    pid = listener_of(waiter).pid
    await asyncio.sleep(0.5)  # (ten times listen_idle)
    assert listener_of(waiter).pid == pid
    assert await _alive(conn, pid)
    await lock.release()
    await waiting


async def test_waits_that_race_the_idle_close_are_all_woken(
    make_client: ClientFactory, strategy: str
) -> None:
    holder, waiter = await _clients(make_client, strategy, 0.002)
    rng = random.Random(7)
    pids = set()
    for _ in range(25):
        pids.add(await _hand_over(holder, waiter, "race"))
        await asyncio.sleep(rng.choice([0, 0, 0.001, 0.002, 0.003, 0.01]))
    assert len(pids) > 1  # (the session did close between waits)
    await eventually(lambda: listener_of(waiter).conn is None, what="the session closed")


async def test_close_while_an_idle_close_is_due(
    make_client: ClientFactory, raw: RawFactory, strategy: str
) -> None:
    conn = await raw()
    holder, waiter = await _clients(make_client, strategy, HANG)
    pid = await _hand_over(holder, waiter, "closing")
    listener = listener_of(waiter)
    started = time.monotonic()
    await waiter.close()  # (the idle close, due in HANG s, does not hold it up)
    assert time.monotonic() - started < HANG / 2
    assert listener.conn is None
    assert listener.closed
    await eventually(lambda: _gone(conn, pid), what="the session gone from the server")
