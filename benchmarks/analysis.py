"""Where aiodlock's Redis time goes: the measurements behind docs/benchmarks.md's analysis.

    python -m benchmarks.analysis            # a fresh redis-server on a free loopback port

1. Server time per acquire+release cycle (INFO commandstats, which counts the commands run
   inside scripts as well), aiodlock against the floor.
2. The owner-change handoff gap of workload B split in two: release call -> the release
   message seen by this process, and message seen -> the next holder's entry.  A listener
   pattern-subscribes to the release channels of the documented key layout
   (``<namespace>:{<name>}:released`` and the fair waiters' ``...:released:<owner>``).
3. The first contention on a name: 8 tasks start together and take the lock 3 times each
   (the first releases happen before this client's subscription to the name's channel is
   confirmed).

Not part of the benchmark run; one-off numbers for the backend's developers.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from typing import Any

from .adapters import ADAPTERS
from .server import redis_server
from .stats import percentile

perf = time.perf_counter


def _ms(values: list[float], q: float) -> str:
    value = percentile(sorted(values), q)
    return "n/a" if value is None else f"{value * 1000:.3f}"


async def server_time(url: str, seconds: float = 1.0) -> None:
    import redis.asyncio as aioredis

    from . import workloads

    monitor = aioredis.Redis.from_url(url)
    print("1. server command time per acquire+release cycle (INFO commandstats)")
    for name in ("aiodlock", "floor"):
        adapter = ADAPTERS[name](url)
        await adapter.open()
        await workloads.warm_up(adapter, f"analysis:warm:{name}")
        await monitor.config_resetstat()
        result = await workloads.single(adapter, f"analysis:{name}", seconds=seconds)
        stats: dict[str, Any] = await monitor.info("commandstats")
        await adapter.close()
        cycles = result["cycles"]
        top = 0.0
        print(f"   {name}: {cycles} cycles")
        for command, row in sorted(stats.items()):
            command = command.removeprefix("cmdstat_")
            if command in ("info", "config|resetstat"):
                continue
            if command in ("evalsha", "eval", "set"):
                top += row["usec"]
            print(
                f"     {command:<10} {row['calls'] / cycles:5.2f} calls/cycle, "
                f"{row['usec_per_call']:6.2f} µs/call"
            )
        print(f"     top-level commands (scripts include their inner ones): "
              f"{top / cycles:.1f} µs/cycle")  # fmt: skip
    await monitor.aclose()


async def gap_breakdown(url: str, fair: bool, seconds: float = 3.0) -> None:
    import redis.asyncio as aioredis

    import aiodlock

    name = f"analysis-gap-{'fair' if fair else 'plain'}"
    listener = aioredis.Redis.from_url(url).pubsub()
    await listener.psubscribe(f"aiodlock:{{{name}}}:released*")
    seen: list[float] = []

    async def listen() -> None:
        async for message in listener.listen():
            if message["type"] == "pmessage":
                seen.append(perf())

    listening = asyncio.create_task(listen())
    client = aiodlock.connect(url)
    await client.open()
    entries: list[tuple[float, float, int]] = []
    stop = False

    async def worker(index: int) -> None:
        lock = client.lock(name, fair=fair)
        while not stop:
            await lock.acquire()
            entered = perf()
            await asyncio.sleep(0)
            left = perf()
            await lock.release()
            entries.append((entered, left, index))

    tasks = [asyncio.create_task(worker(i)) for i in range(8)]
    await asyncio.sleep(0.5)
    begin = perf()
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*tasks)
    listening.cancel()
    await asyncio.gather(listening, return_exceptions=True)
    await listener.aclose()
    await client.close()
    entries.sort()
    to_message: list[float] = []
    to_entry: list[float] = []
    total: list[float] = []
    for (_, left, who), (entered, _, nxt) in itertools.pairwise(entries):
        if who == nxt or entered < begin:
            continue
        total.append(entered - left)
        k = bisect.bisect_left(seen, left)
        if k < len(seen) and seen[k] < entered:
            to_message.append(seen[k] - left)
            to_entry.append(entered - seen[k])
    print(f"2. handoff gap, fair={fair}: {len(total)} owner changes")
    print(f"     release call -> next entry    p50 {_ms(total, 50)} ms, p99 {_ms(total, 99)} ms")
    print(f"     release call -> message seen  p50 {_ms(to_message, 50)} ms, "
          f"p99 {_ms(to_message, 99)} ms")  # fmt: skip
    print(f"     message seen -> next entry    p50 {_ms(to_entry, 50)} ms, "
          f"p99 {_ms(to_entry, 99)} ms")  # fmt: skip


async def first_contention(url: str, rounds: int = 3) -> None:
    import aiodlock

    client = aiodlock.connect(url)
    await client.open()
    waits: list[float] = []
    started = perf()

    async def worker() -> None:
        lock = client.lock("analysis-first")
        for _ in range(rounds):
            requested = perf()
            await lock.acquire()
            waits.append(perf() - requested)
            await asyncio.sleep(0)
            await lock.release()

    await asyncio.gather(*(worker() for _ in range(8)))
    took = perf() - started
    await client.close()
    longest = ", ".join(f"{w * 1000:.1f}" for w in sorted(waits)[-8:])
    print(
        f"3. first contention on a name: 8 tasks x {rounds} acquisitions took "
        f"{took * 1000:.1f} ms; longest waits {longest} ms"
    )


async def main(url: str) -> None:
    await server_time(url)
    await gap_breakdown(url, fair=False)
    await gap_breakdown(url, fair=True)
    await first_contention(url)


if __name__ == "__main__":
    with redis_server() as server:
        asyncio.run(main(server.url))
