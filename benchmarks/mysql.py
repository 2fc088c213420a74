"""MySQL/MariaDB benchmarks: each strategy of ``mysql://`` against the raw floor.

The floor is the fewest statements a correct table lock needs: an ``INSERT`` of the name's
row and a ``DELETE`` by owner, on one connection in autocommit.  Measured, on a fresh
MariaDB on a free loopback port (``tests/servers.py``):

* uncontended lock cycles per second (one client, one task) for the floor and each strategy;
* the hand-off gap: a waiter in another client of the same process takes the name after
  the holder releases it (p50 and max, ms);
* pool exhaustion: 100 waiters on a pool of 10 (``strategy=table``) while the name is held;
  a ``status()`` call must still answer at once, and every waiter gets its turn.

    python -m benchmarks.mysql                 # ~20 s
    python -m benchmarks.mysql --quick         # a smoke run

Prints a table and the targets of issue 14 (PASS/FAIL); the numbers are in
docs/backends/mysql.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import aiodlock

from .server import log, mariadb_server

__all__ = ["STRATEGIES", "main", "run"]

STRATEGIES = ("table", "named", "row")


async def floor(port: int, database: str, cycles: int) -> float:
    """Cycles per second of INSERT + DELETE by owner on one autocommit connection."""
    import aiomysql

    conn = await aiomysql.connect(
        host="127.0.0.1", port=port, user="root", db=database, autocommit=True
    )
    try:
        async with conn.cursor() as cursor:
            await cursor.execute(
                "CREATE TABLE IF NOT EXISTS bench_floor "
                "(name VARBINARY(255) PRIMARY KEY, owner VARCHAR(64) NOT NULL)"
            )
            started = time.perf_counter()
            for _ in range(cycles):
                await cursor.execute("INSERT INTO bench_floor VALUES (UNHEX(%s), %s)", ("6a", "me"))
                await cursor.execute(
                    "DELETE FROM bench_floor WHERE name = UNHEX(%s) AND owner = %s", ("6a", "me")
                )
            return cycles / (time.perf_counter() - started)
    finally:
        conn.close()


async def uncontended(url: str, cycles: int) -> float:
    async with aiodlock.connect(url, namespace="bench-a") as client:
        for _ in range(max(5, cycles // 10)):  # warm-up: connections, tables, counters
            async with client.lock("a"):
                pass
        started = time.perf_counter()
        for _ in range(cycles):
            async with client.lock("a"):
                pass
        return cycles / (time.perf_counter() - started)


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
    with mariadb_server() as server:
        log(f"MariaDB on {server.address}")
        result: dict[str, Any] = {"floor": await floor(server.port, server.database, args.cycles)}
        for strategy in STRATEGIES:
            url = f"{server.url}?strategy={strategy}"
            gaps = await handoff(url, args.rounds)
            result[strategy] = {
                "cycles_per_s": await uncontended(url, args.cycles),
                "handoff_p50_ms": statistics.median(gaps),
                "handoff_max_ms": max(gaps),
            }
        result["exhaustion"] = await exhaustion(f"{server.url}?strategy=table", args.waiters, 10)
        result["waiters"] = args.waiters
    return result


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "| | cycles/s | x floor | hand-off p50 / max ms |",
        "|---|---:|---:|---:|",
        f"| floor (INSERT + DELETE) | {result['floor']:,.0f} | 1.00 | |",
    ]
    for strategy in STRATEGIES:
        r = result[strategy]
        lines.append(
            f"| {strategy} | {r['cycles_per_s']:,.0f} | {r['cycles_per_s'] / result['floor']:.2f}"
            f" | {r['handoff_p50_ms']:.2f} / {r['handoff_max_ms']:.2f} |"
        )
    ex = result["exhaustion"]
    lines.append("")
    lines.append(
        f"{result['waiters']} waiters on a pool of 10: status() in {ex['status_ms']:.1f} ms "
        f"while they wait; {ex['served']} served in {ex['all_served_s']:.2f} s after the release"
    )
    all_served = ex["served"] == result["waiters"]
    targets = [
        (
            "table uncontended >= 0.8x the floor",
            result["table"]["cycles_per_s"] >= 0.8 * result["floor"],
        ),
        ("named hand-off p50 < 5 ms", result["named"]["handoff_p50_ms"] < 5),
        ("row hand-off p50 < 5 ms", result["row"]["handoff_p50_ms"] < 5),
        ("no pool exhaustion (status < 1 s, all served)", ex["status_ms"] < 1000 and all_served),
    ]
    lines.append("")
    lines += [f"- {name}: {'PASS' if ok else 'FAIL'}" for name, ok in targets]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mysql", description=__doc__)
    p.add_argument("--cycles", type=int, default=300, help="uncontended cycles per strategy")
    p.add_argument("--rounds", type=int, default=30, help="hand-offs per strategy")
    p.add_argument("--waiters", type=int, default=100, help="waiters on the pool of 10")
    p.add_argument("--quick", action="store_true", help="a smoke run (numbers are noise)")
    p.add_argument("--json", metavar="PATH", help="also write the results to PATH")
    args = p.parse_args(argv)
    if args.quick:
        args.cycles, args.rounds, args.waiters = 20, 3, 20
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
