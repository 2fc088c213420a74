"""``strategy=table``, processes and faults: exclusion across OS processes, a killed holder
process, a restart of PostgreSQL while a lock is held (and while a client waits), a server
that stops answering (SIGSTOP)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import aiodlock
from tests.helpers import (
    HANG,
    ClientFactory,
    ServeFactory,
    assert_exclusive,
    eventually,
    run_cycles,
)
from tests.servers import PostgresServer

from .test_pg_table import table_of

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def test_mutual_exclusion_and_token_order_across_processes(
    postgres_server: PostgresServer, namespace: str, tmp_path: Path
) -> None:
    url = f"{postgres_server.url}?strategy=table"
    options = (f"namespace={namespace}", "poll_interval=0.05")
    cycles = await run_cycles(url, 3, 12, tmp_path / "log.txt", *options)
    assert_exclusive(cycles, 3, 12)


async def test_a_killed_holders_lock_is_taken_over_after_its_lease(
    postgres_server: PostgresServer,
    namespace: str,
    make_client: ClientFactory,
    serve: ServeFactory,
) -> None:
    ttl = 1.0
    url = f"{postgres_server.url}?strategy=table"
    child = await serve(url, "job", f"namespace={namespace}", f"watchdog_ttl={ttl}")
    token = int(await child.ask("acquire", "HELD"))
    client = await make_client(url, poll_interval=0.2)
    status = await client.status("job")
    assert status is not None
    assert status.token == token
    child.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await child.proc.wait()
    # No NOTIFY comes (the holder died): the row expires with its lease, and a waiter's
    # next poll takes it over.
    async with client.lock("job", timeout=HANG) as lease:
        took = time.monotonic() - killed_at
        assert lease.token > token  # (a new row: a larger id)
    assert took < ttl + 1.5, took
    assert await client.status("job") is None


async def test_a_restart_keeps_the_lock_and_the_waiter_listens_again(
    postgres_factory: Callable[..., PostgresServer], make_client: ClientFactory
) -> None:
    server = postgres_factory()
    url = f"{server.url}?strategy=table"
    ttl = 3.0
    client = await make_client(url, watchdog_ttl=ttl)
    waiting = await make_client(url, poll_interval=HANG)  # (no fallback poll: NOTIFY only)
    lease = await client.lock("job", owner="k").acquire()
    ear, key = table_of(waiting).listener, table_of(waiting).key("job")
    task = asyncio.create_task(waiting.lock("job", owner="w").acquire(timeout=HANG * 2))
    await eventually(lambda: ear.listening_for(key), what="listening")
    pid = ear.pid
    await asyncio.to_thread(server.restart)  # the rows are on disk: the lease survives
    # The watchdog reconnects and renews: the lease outlives several ttls; meanwhile the
    # waiter's client LISTENs again on its own.
    await eventually(lambda: ear.listening_for(key) and ear.pid != pid, what="listening again")
    await asyncio.sleep(ttl * 1.5)
    assert not lease.lost
    assert not task.done()
    status = await waiting.status("job")
    assert status is not None
    assert status.owner == lease.owner
    assert status.expires_in is not None
    assert status.expires_in > ttl / 3
    woke = ear.woke
    await client.lock("job", owner="k").release()
    second = await asyncio.wait_for(task, HANG / 3)  # (woken by the NOTIFY)
    assert second.token > lease.token  # (the id survived the restart)
    assert ear.woke == woke + 1
    await waiting.lock("job", owner="w").release()


async def test_a_server_that_stops_answering_is_an_error_within_op_timeout(
    postgres_factory: Callable[..., PostgresServer], namespace: str
) -> None:
    server = postgres_factory()
    op_timeout = 1.0
    url = f"{server.url}?strategy=table"
    options = {"namespace": namespace, "op_timeout": op_timeout, "connect_timeout": op_timeout}
    async with aiodlock.connect(url, **options) as client:
        async with client.lock("warm"):  # (a pooled session)
            pass
        server.pause()
        try:
            for call in (client.lock("p").try_acquire(), client.status("p")):
                started = time.monotonic()
                with pytest.raises(aiodlock.BackendError):
                    await call
                assert time.monotonic() - started < op_timeout * 2 + 1
        finally:
            server.resume()
        # The server answers again: the sessions cut short were discarded, and the client
        # works on new ones.
        async with client.lock("p", timeout=HANG) as lease:
            assert not lease.lost
