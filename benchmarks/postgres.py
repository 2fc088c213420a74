"""PostgreSQL benchmarks: aiodlock's ``postgresql://`` (both strategies) against the raw
floor and against what people write by hand, on a throw-away PostgreSQL on a free loopback
port (``tests/servers.py``; fsync off unless ``--durable``).

* A (uncontended): one task, one name, acquire+release cycles in paired slices
  (:mod:`benchmarks.paired`: ``--a-rounds`` rounds of one ``--a-seconds`` slice each, in a
  turning order) with the floor: ``pg_try_advisory_lock`` + ``pg_advisory_unlock`` on one
  asyncpg connection.  The ratio to the floor is taken per round, its median reported.
  ``strategy=table`` runs in the same rounds (recorded, no target), and so does the raw
  bound: the cheapest cycle any fenced advisory lock can have (the try-lock and a bump of a
  counter row in one statement, then the unlock: raw SQL, no owner written, no library).
* B (hand-off gap): ``--b-clients`` clients (one task each, so the lock passes between
  sessions, not between the tasks of one client) take turns on one name holding it 1 ms;
  the gap is from the holder's release call to the next holder's grant, when that is another
  client (a client that takes the lock back at once is no hand-off).  The same for
  ``strategy=table`` and for the polling loop (``pg_try_advisory_lock``, then a 0.1 s sleep
  when busy).
* W (wake-ups): ``--waiters`` clients wait on one name and take it in turn; the NOTIFYs
  that woke a waiter, per hand-off (the fallback poll is off: ``poll_interval`` 60 s), for
  each strategy.

    python -m benchmarks.postgres [--quick] [--durable]

Prints the issue's targets (PASS/FAIL) and writes ``benchmarks/results/postgres.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import asyncpg

import aiodlock
from aiodlock.backends.postgres import PostgresBackend
from aiodlock.backends.postgres.table import PostgresTableBackend

from .paired import Slice, paired_ratio, run_paired, timed
from .server import ROOT, log, temporary_server

perf = time.perf_counter
KEY = 4242


_LOCK = "SELECT pg_try_advisory_lock($1::bigint)"
_UNLOCK = "SELECT pg_advisory_unlock($1::bigint)"


async def _floor(conn: asyncpg.Connection) -> None:
    assert await conn.fetchval(_LOCK, KEY)
    await conn.fetchval(_UNLOCK, KEY)


#: The least any fenced advisory lock must send: the try-lock and, when taken, a bump of the
#: key's counter row in the same statement (an UPDATE of a row that exists: no owner written,
#: no line of waiters looked at), then the unlock.  Raw SQL on one connection, no library.
_BOUND_TABLE = "bench_bound_tokens"
_BOUND_TAKE = (
    "WITH got AS (SELECT pg_try_advisory_lock($1::bigint) AS ok) "
    f"UPDATE {_BOUND_TABLE} c SET token = c.token + 1 FROM got "
    "WHERE got.ok AND c.key = $1::bigint RETURNING c.token"
)


async def _bound_table(conn: asyncpg.Connection) -> None:
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {_BOUND_TABLE} (key bigint PRIMARY KEY, token bigint)"
        " WITH (fillfactor = 50)"
    )
    await conn.execute(f"INSERT INTO {_BOUND_TABLE} VALUES ($1, 0) ON CONFLICT DO NOTHING", KEY)


async def _bound(conn: asyncpg.Connection) -> None:
    assert await conn.fetchval(_BOUND_TAKE, KEY)
    await conn.fetchval(_UNLOCK, KEY)


def _cycles(lock: aiodlock.Lock) -> Slice:
    async def cycle() -> None:
        await lock.acquire()
        await lock.release()

    return timed(cycle)


async def workload_a(url: str, rounds: int, seconds: float) -> dict[str, Any]:
    """Paired slices (:mod:`benchmarks.paired`): floor, advisory, table and the raw bound."""
    namespace = f"a{uuid.uuid4().hex[:8]}"
    floor_conn, bound_conn = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        await _bound_table(bound_conn)
        async with (
            aiodlock.connect(url, namespace=namespace) as client,
            aiodlock.connect(f"{url}?strategy=table", namespace=namespace) as rows,
        ):
            loops = {
                "floor": timed(lambda: _floor(floor_conn)),
                "advisory": _cycles(client.lock("a")),
                "table": _cycles(rows.lock("a")),
                "bound": timed(lambda: _bound(bound_conn)),
            }
            rates = await run_paired(loops, rounds=rounds, seconds=seconds, progress=log)
    finally:
        await floor_conn.close()
        await bound_conn.close()
    floor = rates["floor"]
    return {
        "rounds": rounds,
        "slice_seconds": seconds,
        "floor": floor,
        "aiodlock": rates["advisory"],
        "ratio_median": paired_ratio(rates["advisory"], floor),
        "table": rates["table"],
        "table_ratio_median": paired_ratio(rates["table"], floor),
        "bound": rates["bound"],
        "bound_ratio_median": paired_ratio(rates["bound"], floor),
    }


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def workload_b_aiodlock(url: str, clients: int, cycles: int) -> list[float]:
    namespace = f"b{uuid.uuid4().hex[:8]}"
    released: list[Any] = [0.0, None]  # when, by whom
    gaps: list[float] = []
    opened = [aiodlock.connect(url, namespace=namespace) for _ in range(clients)]
    for client in opened:
        await client.open()

    async def run(client: aiodlock.Client) -> None:
        for _ in range(cycles):
            async with client.lock("b", timeout=60):
                if released[1] not in (None, client):  # (a hand-off to another client)
                    gaps.append(perf() - released[0])
                await asyncio.sleep(0.001)
                released[:] = perf(), client

    try:
        await asyncio.gather(*(run(c) for c in opened))
    finally:
        for client in opened:
            await client.close()
    return [g * 1000 for g in gaps]


async def workload_b_polling(url: str, clients: int, cycles: int) -> list[float]:
    released: list[Any] = [0.0, None]
    gaps: list[float] = []
    conns = [await asyncpg.connect(url) for _ in range(clients)]

    async def run(conn: asyncpg.Connection) -> None:
        for _ in range(cycles):
            while not await conn.fetchval(_LOCK, KEY):
                await asyncio.sleep(0.1)
            if released[1] not in (None, conn):
                gaps.append(perf() - released[0])
            await asyncio.sleep(0.001)
            released[:] = perf(), conn
            await conn.fetchval(_UNLOCK, KEY)

    try:
        await asyncio.gather(*(run(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
    return [g * 1000 for g in gaps]


async def workload_w(url: str, waiters: int, strategy: str = "advisory") -> dict[str, float]:
    namespace = f"w{uuid.uuid4().hex[:8]}"
    lock_url = f"{url}?strategy={strategy}"
    holder = aiodlock.connect(lock_url, namespace=namespace)
    await holder.open()
    clients = [
        aiodlock.connect(lock_url, namespace=namespace, poll_interval=60) for _ in range(waiters)
    ]
    for client in clients:
        await client.open()
    backends = [c.backend for c in clients]
    assert all(isinstance(b, PostgresBackend | PostgresTableBackend) for b in backends)
    listeners = [b.listener for b in backends]  # type: ignore[attr-defined]
    done = 0

    async def take(client: aiodlock.Client) -> None:
        nonlocal done
        async with client.lock("w", timeout=120):
            await asyncio.sleep(0.001)
            done += 1

    try:
        await holder.lock("w").acquire()
        tasks = [asyncio.create_task(take(c)) for c in clients]
        conn = await asyncpg.connect(url)
        table = '"aiodlock_tokens_waiters"' if strategy == "advisory" else '"aiodlock_listeners"'
        key = backends[0].key("w")  # type: ignore[attr-defined]
        while await conn.fetchval(f"SELECT count(*) FROM {table} WHERE key = $1", key) < waiters:
            await asyncio.sleep(0.01)
        await conn.close()
        started = perf()
        await holder.lock("w").release()
        await asyncio.gather(*tasks)
        elapsed = perf() - started
    finally:
        for client in [holder, *clients]:
            await client.close()
    woke = sum(x.woke for x in listeners)
    heard = sum(x.heard for x in listeners)
    return {
        "handoffs": waiters,
        "wakeups_per_handoff": woke / waiters,
        "notifications_heard_per_handoff": heard / waiters,
        "ms_per_handoff": elapsed * 1000 / waiters,
    }


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    result["A"] = await workload_a(url, args.a_rounds, args.a_seconds)
    ours = await workload_b_aiodlock(url, args.b_clients, args.b_cycles)
    table = await workload_b_aiodlock(f"{url}?strategy=table", args.b_clients, args.b_cycles)
    polling = await workload_b_polling(url, args.b_clients, max(5, args.b_cycles // 10))
    result["B"] = {
        name: {"p50_ms": _pct(gaps, 0.5), "p99_ms": _pct(gaps, 0.99), "n": len(gaps)}
        for name, gaps in (("aiodlock", ours), ("table", table), ("polling", polling))
    }
    log(f"B: {result['B']}")
    result["W"] = await workload_w(url, args.waiters)
    log(f"W: {result['W']}")
    result["W_table"] = await workload_w(url, args.waiters, "table")
    log(f"W (table): {result['W_table']}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on")
    parser.add_argument("--a-rounds", type=int, default=80, help="A: paired rounds")
    parser.add_argument("--a-seconds", type=float, default=0.1, help="A: one slice")
    parser.add_argument("--b-clients", type=int, default=4)
    parser.add_argument("--b-cycles", type=int, default=200)
    parser.add_argument("--waiters", type=int, default=100)
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    args = parser.parse_args(argv)
    if args.quick:
        args.a_rounds, args.a_seconds, args.b_cycles, args.waiters = 4, 0.1, 30, 20
    extra = ["-c", "max_connections=400"]
    if args.durable:
        extra += ["-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on"]

    def make(servers: Any, base: Any) -> Any:
        return servers.PostgresServer(base, extra_args=extra)

    with temporary_server("postgres", make, "aiodlock-bench-pg-") as server:
        result = asyncio.run(run(args, server.url))
    result["durable"] = args.durable
    a, b, w = result["A"], result["B"]["aiodlock"], result["W"]
    targets = [
        ("A: uncontended >= 0.8x the floor", a["ratio_median"] >= 0.8, a["ratio_median"]),
        ("B: hand-off gap p50 < 2 ms", b["p50_ms"] < 2, b["p50_ms"]),
        ("B: hand-off gap p99 < 10 ms", b["p99_ms"] < 10, b["p99_ms"]),
        (f"W: wake-ups per hand-off 1.0 ({args.waiters} waiters)",
         abs(w["wakeups_per_handoff"] - 1.0) < 1e-9, w["wakeups_per_handoff"]),
    ]  # fmt: skip
    for text, ok, value in targets:
        print(f"{'PASS' if ok else 'FAIL'}  {text}: {value:.3g}")
    print(f"polling loop: hand-off gap p50 {result['B']['polling']['p50_ms']:.1f} ms, "
          f"p99 {result['B']['polling']['p99_ms']:.1f} ms")  # fmt: skip
    print(f"raw bound (try-lock + counter-row bump, unlock; raw SQL, no library): "
          f"{a['bound_ratio_median']:.2f}x the floor")  # fmt: skip
    t, wt = result["B"]["table"], result["W_table"]
    print(f"strategy=table (no target): uncontended {statistics.median(a['table']):.0f}/s "
          f"({a['table_ratio_median']:.2f}x the floor), hand-off gap p50 {t['p50_ms']:.1f} ms, "
          f"p99 {t['p99_ms']:.1f} ms, wake-ups per hand-off {wt['wakeups_per_handoff']:.2f}, "
          f"NOTIFYs heard per hand-off {wt['notifications_heard_per_handoff']:.1f}")  # fmt: skip
    if args.json:  # (read by benchmarks.suite)
        with open(args.json, "w") as file:
            json.dump(result, file, indent=2)
    if not args.quick:
        name = "postgres-durable" if args.durable else "postgres"
        out = ROOT / "benchmarks" / "results" / f"{name}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {out}")


if __name__ == "__main__":
    main()
