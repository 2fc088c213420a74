"""MySQL/MariaDB benchmarks: each strategy of ``mysql://`` against the raw floor.

The floor is the fewest statements a correct table lock needs: an ``INSERT`` of the name's
row and a ``DELETE`` by owner, on one connection in autocommit.  Measured, on a fresh
MariaDB on a free loopback port (``tests/servers.py``):

* uncontended lock cycles per second (one client, one task) for the floor, for ``table``'s
  own two statements sent raw on one connection (what they cost without the library), and
  for each strategy, with each driver (``aiomysql``, ``asyncmy``), in paired slices
  (:mod:`benchmarks.paired`: ``--a-rounds`` rounds of one ``--a-seconds`` slice of each, in
  a turning order; "x floor" is the median over the rounds of the ratio within a round, the
  cycles/s the median slice);
* the hand-off gap: a waiter in another client of the same process takes the name after
  the holder releases it (p50 and max, ms);
* pool exhaustion: 100 waiters on a pool of 10 (``strategy=table``) while the name is held;
  a ``status()`` call must still answer at once, and every waiter gets its turn.

    python -m benchmarks.mysql                      # ~70 s, both drivers
    python -m benchmarks.mysql --driver asyncmy     # one driver
    python -m benchmarks.mysql --quick              # a smoke run

Prints a table and the targets of issue 14 (PASS/FAIL); the numbers are in
docs/backends/mysql.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import statistics
import time
from typing import Any

import aiodlock

from .paired import Slice, paired_ratio, run_paired, timed
from .server import log, mariadb_server

__all__ = ["STRATEGIES", "main", "run"]

STRATEGIES = ("table", "named", "row")


async def _connect(driver: str, port: int, database: str) -> Any:
    from aiodlock.backends.mysql._driver import load

    return await load(driver).connect(
        host="127.0.0.1",
        port=port,
        user="root",
        password="",
        database=database,
        connect_timeout=10,
    )


async def _cursor(conn: Any) -> Any:
    cursor = conn.cursor()  # (aiomysql's returns an awaitable, asyncmy's the cursor)
    return await cursor if inspect.isawaitable(cursor) else cursor


async def floor(conn: Any) -> Slice:
    """INSERT + DELETE by owner on one autocommit connection."""
    cursor = await _cursor(conn)
    await cursor.execute("SET sql_notes = 0")  # (the table may exist)
    await cursor.execute(
        "CREATE TABLE IF NOT EXISTS bench_floor "
        "(name VARBINARY(255) PRIMARY KEY, owner VARCHAR(64) NOT NULL)"
    )

    async def cycle() -> None:
        await cursor.execute("INSERT INTO bench_floor VALUES (UNHEX(%s), %s)", ("6a", "me"))
        await cursor.execute(
            "DELETE FROM bench_floor WHERE name = UNHEX(%s) AND owner = %s", ("6a", "me")
        )

    return timed(cycle)


async def raw_table(url: str, conn: Any) -> Slice:
    """``table``'s own two statements (the fast path's INSERT, with the expiry on the
    server's clock and the token from AUTO_INCREMENT, and its DELETE by owner and token) sent
    raw on one connection: the statements' cost, without the library."""
    from aiodlock.backends._sql import LockTable
    from aiodlock.backends._sql_fast import FastPath
    from aiodlock.backends.mysql._dialect import MYSQL

    async with aiodlock.connect(url, namespace="bench-raw"):
        pass  # (the tables exist)
    fast = FastPath(LockTable(MYSQL, "bench-raw"))
    cursor = await _cursor(conn)
    await cursor.execute("SET time_zone = '+00:00'")
    insert = next(fast.grab("a", "owner", 30.0))

    async def cycle() -> None:
        await cursor.execute(insert.sql, insert.params)
        delete = next(fast.drop("a", "owner", cursor.lastrowid))
        await cursor.execute(delete.sql, delete.params)

    return timed(cycle)


def uncontended(client: aiodlock.Client) -> Slice:
    """``async with client.lock("a")`` cycles (a handle per cycle: the common use)."""

    async def cycle() -> None:
        async with client.lock("a"):
            pass

    return timed(cycle)


async def workload_a(
    server: Any, drivers: list[str], rounds: int, seconds: float
) -> dict[str, dict[str, list[float]]]:
    """Paired slices (:mod:`benchmarks.paired`) of every driver's floor, raw statements and
    strategies: cycles/s per round, by driver and loop."""
    loops: dict[str, Slice] = {}
    async with contextlib.AsyncExitStack() as stack:
        for driver in drivers:
            conns = [await _connect(driver, server.port, server.database) for _ in range(2)]
            for conn in conns:
                stack.callback(conn.close)
            loops[f"{driver}|floor"] = await floor(conns[0])
            url = f"{server.url}?driver={driver}"
            loops[f"{driver}|raw"] = await raw_table(url, conns[1])
            for strategy in STRATEGIES:
                url = f"{server.url}?strategy={strategy}&driver={driver}"
                client = aiodlock.connect(url, namespace=f"bench-a-{strategy}")
                await stack.enter_async_context(client)
                loops[f"{driver}|{strategy}"] = uncontended(client)
        rates = await run_paired(loops, rounds=rounds, seconds=seconds, progress=log)
    out: dict[str, dict[str, list[float]]] = {}
    for key, values in rates.items():
        driver, what = key.split("|")
        out.setdefault(driver, {})[what] = values
    return out


async def handoff(url: str, rounds: int) -> list[float]:
    """Gaps (ms) from a release to the entry of a waiter of another client."""
    gaps: list[float] = []
    async with (
        aiodlock.connect(url, namespace="bench-b") as first,
        aiodlock.connect(url, namespace="bench-b") as second,
    ):
        for _ in range(rounds):
            held = first.lock("b")
            await held.acquire()
            entered = asyncio.Event()
            at = 0.0

            async def wait(entered: asyncio.Event = entered) -> None:
                nonlocal at
                async with second.lock("b", timeout=30):
                    at = time.perf_counter()
                    entered.set()

            task = asyncio.create_task(wait())
            await asyncio.sleep(0.05)  # (the waiter is waiting)
            released = time.perf_counter()
            await held.release()
            await asyncio.wait_for(entered.wait(), 30)
            await task
            gaps.append((at - released) * 1000)
    return gaps


async def exhaustion(url: str, waiters: int, pool: int) -> dict[str, Any]:
    """``waiters`` waiters on a pool of ``pool`` while the name is held."""
    async with (
        aiodlock.connect(url, namespace="bench-c") as holder,
        aiodlock.connect(url, namespace="bench-c", pool_size=pool) as client,
    ):
        held = holder.lock("c")
        await held.acquire()
        done = 0

        async def wait() -> None:
            nonlocal done
            async with client.lock("c", timeout=60):
                done += 1

        tasks = [asyncio.create_task(wait()) for _ in range(waiters)]
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        await client.status("c")
        status_ms = (time.perf_counter() - started) * 1000
        await held.release()
        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        return {
            "status_ms": status_ms,
            "all_served_s": time.perf_counter() - started,
            "served": done,
        }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    drivers: list[str] = args.drivers
    with mariadb_server() as server:
        log(f"MariaDB on {server.address}")
        a = await workload_a(server, drivers, args.a_rounds, args.a_seconds)
        result: dict[str, Any] = {
            "drivers": drivers,
            "waiters": args.waiters,
            "a_rounds": args.a_rounds,
            "a_seconds": args.a_seconds,
        }
        for driver in drivers:
            rates = a[driver]
            floor_rates = rates["floor"]
            per: dict[str, Any] = {
                "floor": statistics.median(floor_rates),
                "raw": statistics.median(rates["raw"]),
                "raw_ratio": paired_ratio(rates["raw"], floor_rates),
            }
            for strategy in STRATEGIES:
                url = f"{server.url}?strategy={strategy}&driver={driver}"
                gaps = await handoff(url, args.rounds)
                per[strategy] = {
                    "cycles_per_s": statistics.median(rates[strategy]),
                    "ratio": paired_ratio(rates[strategy], floor_rates),
                    "handoff_p50_ms": statistics.median(gaps),
                    "handoff_max_ms": max(gaps),
                }
            per["exhaustion"] = await exhaustion(
                f"{server.url}?strategy=table&driver={driver}", args.waiters, 10
            )
            result[driver] = per
    return result


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "| driver | | cycles/s | x floor | hand-off p50 / max ms |",
        "|---|---|---:|---:|---:|",
    ]
    targets: list[tuple[str, bool]] = []
    for driver in result["drivers"]:
        r = result[driver]
        lines.append(f"| {driver} | floor (INSERT + DELETE) | {r['floor']:,.0f} | 1.00 | |")
        raw = r.get("raw")
        if raw is not None:
            lines.append(
                f"| {driver} | table's statements, raw | {raw:,.0f} | {r['raw_ratio']:.2f} | |"
            )
        for strategy in STRATEGIES:
            s = r[strategy]
            lines.append(
                f"| {driver} | {strategy} | {s['cycles_per_s']:,.0f} "
                f"| {s['ratio']:.2f} "
                f"| {s['handoff_p50_ms']:.2f} / {s['handoff_max_ms']:.2f} |"
            )
        ex = r["exhaustion"]
        all_served = ex["served"] == result["waiters"]
        targets += [
            (
                f"{driver}: table uncontended >= 0.8x the floor",
                r["table"]["ratio"] >= 0.8,
            ),
            (f"{driver}: named hand-off p50 < 5 ms", r["named"]["handoff_p50_ms"] < 5),
            (f"{driver}: row hand-off p50 < 5 ms", r["row"]["handoff_p50_ms"] < 5),
            (
                f"{driver}: no pool exhaustion (status < 1 s, all served)",
                ex["status_ms"] < 1000 and all_served,
            ),
        ]
    lines.append("")
    for driver in result["drivers"]:
        ex = result[driver]["exhaustion"]
        lines.append(
            f"{driver}: {result['waiters']} waiters on a pool of 10: status() in "
            f"{ex['status_ms']:.1f} ms while they wait; {ex['served']} served in "
            f"{ex['all_served_s']:.2f} s after the release"
        )
    if len(result["drivers"]) > 1:
        first, *others = result["drivers"]
        for other in others:
            for what in ("floor", *STRATEGIES):
                a, b = result[first][what], result[other][what]
                a = a if what == "floor" else a["cycles_per_s"]
                b = b if what == "floor" else b["cycles_per_s"]
                lines.append(f"{what}: {other} / {first} = {b / a:.2f}")
    lines.append("")
    lines += [f"- {name}: {'PASS' if ok else 'FAIL'}" for name, ok in targets]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mysql", description=__doc__)
    p.add_argument("--a-rounds", type=int, default=40, help="A: paired rounds")
    p.add_argument("--a-seconds", type=float, default=0.1, help="A: one slice")
    p.add_argument(
        "--driver",
        dest="drivers",
        action="append",
        choices=("aiomysql", "asyncmy"),
        help="a driver to measure (repeat it for several; default: both)",
    )
    p.add_argument("--rounds", type=int, default=30, help="hand-offs per strategy")
    p.add_argument("--waiters", type=int, default=100, help="waiters on the pool of 10")
    p.add_argument("--quick", action="store_true", help="a smoke run (numbers are noise)")
    p.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    args = p.parse_args(argv)
    args.drivers = args.drivers or ["aiomysql", "asyncmy"]
    if args.quick:
        args.a_rounds, args.a_seconds, args.rounds, args.waiters = 2, 0.05, 3, 20
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(run(args))
    print("\n".join(report(result)))
    if args.json:  # (read by benchmarks.suite)
        with open(args.json, "w") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
