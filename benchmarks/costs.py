"""Where a cycle's CPU goes: the measurements behind the readings in docs/benchmarks.md.

``python -m benchmarks.costs`` (~45 s) prints three tables, each a median over rounds that
alternate the variants:

- ``server``: redis-server CPU (``/proc/PID/stat``) per cycle of two requests sent one at a
  time from a raw blocking socket (no client library at all): two PINGs, the floor's
  ``SET NX PX`` + compare-and-delete script, aiodlock's acquire + release scripts;
- ``transport``: the floor's two commands sent through redis-py's ``Connection`` and through
  an asyncio protocol with the hiredis reader (aiodlock's ``redis._wire.Pipe``), and
  aiodlock's acquire + release scripts through the same protocol (the same client code:
  what differs is the server's work): wall time and this process's user/system CPU per
  cycle;
- ``redlock``: aiodlock's ``redlock://`` on five fresh servers, one task acquiring and
  releasing one name: this process's CPU and the five servers' CPU per cycle;
- ``placement``: workload A (one task, acquire + release through each adapter: aiodlock's
  public API and the floor) with this process and the redis-server where the scheduler puts
  them, pinned to ONE CPU, and pinned to two different CPUs: wall time per cycle, how often
  per cycle this process went to sleep waiting (voluntary context switches), and the
  server's time in commands per cycle (``INFO commandstats``).  On a virtual machine a
  sleeping process woken from another CPU costs tens of microseconds; this table shows how
  much of a cycle that is, and how a client that is still busy when the reply comes (as a
  slower one often is) escapes part of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import hiredis

from aiodlock.backends.redis import _scripts as scripts
from aiodlock.backends.redis._wire import Pipe, ScriptCall, pack, resolver

from .server import redis_server, temporary_server

FLOOR_DELETE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end"
)


def _process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _median_table(title: str, rows: dict[str, list[tuple[float, ...]]], heads: list[str]) -> None:
    print(f"\n{title}\n| variant | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for name, samples in rows.items():
        cells = [f"{statistics.median(s[i] for s in samples):.1f}" for i in range(len(heads))]
        print(f"| {name} | " + " | ".join(cells) + " |")


def server_cost(rounds: int, cycles: int) -> None:
    with redis_server() as server:
        sock = socket.create_connection((server.host, server.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = hiredis.Reader()

        def call(data: bytes) -> Any:
            sock.sendall(data)
            while True:
                reader.feed(sock.recv(65536))
                reply = reader.gets()
                if reply is not False:
                    return reply

        for script in scripts.ALL_SCRIPTS:
            call(pack(b"SCRIPT", b"LOAD", script.source))
        floor_sha = call(pack(b"SCRIPT", b"LOAD", FLOOR_DELETE))
        keys = scripts.LockKeys("aiodlock", "cost")
        release_keys = (keys.lock, keys.queue, keys.deadlines)
        release_args = (b"o:1", b"", keys.channel, keys.waiter_prefix)
        variants = {
            "two PINGs": [pack(b"PING"), pack(b"PING")],
            "floor: SET NX PX + script": [
                pack(b"SET", b"floor", b"tok", b"NX", b"PX", 30000),
                pack(b"EVALSHA", floor_sha, 1, b"floor", b"tok"),
            ],
            "aiodlock: acquire + release scripts": [
                pack(
                    b"EVALSHA", scripts.ACQUIRE.sha, 2, keys.lock, keys.counter, b"owner:1", 30000
                ),
                pack(b"EVALSHA", scripts.RELEASE.sha, 3, *release_keys, *release_args),
            ],
        }
        rows: dict[str, list[tuple[float, ...]]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, commands in variants.items():
                cpu0, t0 = _process_cpu(server.pid), time.perf_counter()
                for _ in range(cycles):
                    for command in commands:
                        call(command)
                cpu = (_process_cpu(server.pid) - cpu0) / cycles * 1e6
                rows[name].append((cpu, (time.perf_counter() - t0) / cycles * 1e6))
        sock.close()
    _median_table(
        "server: two requests per cycle from a raw socket",
        rows,
        ["server CPU µs/cycle", "wall µs/cycle"],
    )


async def _timed(cycle: Callable[[], Awaitable[None]], cycles: int) -> tuple[float, ...]:
    for _ in range(100):
        await cycle()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(cycles):
        await cycle()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return wall / cycles * 1e6, user / cycles * 1e6, system / cycles * 1e6


async def transport_cost(rounds: int, cycles: int) -> None:
    from redis.asyncio.connection import Connection

    with redis_server() as server:
        conn = Connection(host=server.host, port=server.port)
        await conn.connect()  # type: ignore[no-untyped-call]
        await conn.send_command("SCRIPT", "LOAD", FLOOR_DELETE)
        sha = (await conn.read_response()).decode()
        loop = asyncio.get_running_loop()
        _, pipe = await loop.create_connection(
            lambda: Pipe("costs", 5.0, None), server.host, server.port
        )

        async def redis_py() -> None:
            for args in (("SET", "k", "t", "NX", "PX", 30000), ("EVALSHA", sha, 1, "k", "t")):
                await conn.send_packed_command(conn.pack_command(*args), check_health=False)
                await conn.read_response()

        commands = ((b"SET", b"k", b"t", b"NX", b"PX", 30000), (b"EVALSHA", sha, 1, b"k", b"t"))
        floor_packed = [pack(*args) for args in commands]
        for script in (scripts.ACQUIRE, scripts.RELEASE):
            future: asyncio.Future[Any] = loop.create_future()
            pipe.send(pack(b"SCRIPT", b"LOAD", script.source), [resolver(future)])
            await future
        keys = scripts.LockKeys("aiodlock", "costs")
        ours_packed = [
            ScriptCall(scripts.ACQUIRE, (keys.lock, keys.counter), ("o:1", 30000)).data,
            ScriptCall(
                scripts.RELEASE,
                (keys.lock, keys.queue, keys.deadlines),
                ("o:1", "", keys.channel, keys.waiter_prefix),
            ).data,
        ]

        def protocol(packed: list[bytes]) -> Callable[[], Awaitable[None]]:
            async def cycle() -> None:
                for data in packed:
                    future: asyncio.Future[Any] = loop.create_future()
                    pipe.send(data, [resolver(future)])
                    await future

            return cycle

        variants = {
            "redis-py Connection": redis_py,
            "protocol + hiredis": protocol(floor_packed),
            "protocol + hiredis, aiodlock's two scripts": protocol(ours_packed),
        }
        rows: dict[str, list[tuple[float, ...]]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, cycle in variants.items():
                rows[name].append(await _timed(cycle, cycles))
        pipe.close(ConnectionError("done"))
        await conn.disconnect()
    _median_table(
        "transport: two requests per cycle from this process",
        rows,
        ["wall µs/cycle", "user CPU µs/cycle", "system CPU µs/cycle"],
    )


async def redlock_cost(rounds: int, cycles: int) -> None:
    import aiodlock

    five = temporary_server("redis", lambda s, base: s.RedisGroup(base, 5), "aiodlock-costs-")
    with five as group:
        url = "redlock://" + ",".join(f"{member.host}:{member.port}" for member in group)
        pids = [member.pid for member in group]
        async with aiodlock.connect(url) as client:
            lock = client.lock("cost")

            async def cycle() -> None:
                await lock.acquire()
                await lock.release()

            rows: dict[str, list[tuple[float, ...]]] = {"aiodlock redlock, 5 nodes": []}
            for _ in range(rounds):
                servers0 = sum(_process_cpu(p) for p in pids)
                wall, user, system = await _timed(cycle, cycles)
                servers = (sum(_process_cpu(p) for p in pids) - servers0) / (cycles + 100) * 1e6
                rows["aiodlock redlock, 5 nodes"].append((wall, user + system, servers))
    _median_table(
        "redlock: one task, acquire + release on five nodes",
        rows,
        ["wall µs/cycle", "client CPU µs/cycle", "five servers' CPU µs/cycle"],
    )


def _voluntary_switches() -> int:
    with open("/proc/thread-self/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split(":")[1])
    return 0


async def placement_cost(rounds: int, cycles: int) -> None:
    import redis.asyncio as aioredis

    from .adapters import AiodlockRedis, Floor

    cpus = sorted(os.sched_getaffinity(0))
    placements: dict[str, tuple[set[int], set[int]] | None] = {"scheduler's choice": None}
    if len(cpus) >= 2:
        placements["one CPU"] = ({cpus[0]}, {cpus[0]})
        placements["two CPUs"] = ({cpus[0]}, {cpus[1]})
    with redis_server() as server:
        stats = aioredis.Redis(host=server.host, port=server.port)
        adapters = [AiodlockRedis(server.url), Floor(server.url)]
        for adapter in adapters:
            await adapter.open()
        locks = [adapter.new_lock(f"placement-{adapter.name}") for adapter in adapters]
        rows: dict[str, list[tuple[float, ...]]] = {}
        ratios: dict[str, list[float]] = {name: [] for name in placements}
        try:
            for _ in range(rounds):
                for where, pins in placements.items():
                    mine, theirs = pins if pins is not None else (set(cpus), set(cpus))
                    os.sched_setaffinity(0, mine)
                    os.sched_setaffinity(server.pid, theirs)
                    walls = []
                    for adapter, lock in zip(adapters, locks, strict=True):
                        for _ in range(200):
                            await adapter.acquire(lock)
                            await adapter.release(lock)
                        await stats.config_resetstat()
                        switches, t0 = _voluntary_switches(), time.perf_counter()
                        for _ in range(cycles):
                            await adapter.acquire(lock)
                            await adapter.release(lock)
                        wall = (time.perf_counter() - t0) / cycles * 1e6
                        slept = (_voluntary_switches() - switches) / cycles
                        used = await stats.info("commandstats")
                        # (minus the INFO/CONFIG calls of this measurement itself)
                        busy = sum(
                            v["usec"] for k, v in used.items() if not k.endswith(("info", "config"))
                        )
                        rows.setdefault(f"{adapter.name}, {where}", []).append(
                            (wall, slept, busy / cycles)
                        )
                        walls.append(wall)
                    ratios[where].append(walls[1] / walls[0])
        finally:
            os.sched_setaffinity(0, set(cpus))
            for adapter in adapters:
                await adapter.close()
            await stats.aclose()
    _median_table(
        "placement: workload A, this process and the server where the scheduler puts them, "
        "on one CPU, on two",
        rows,
        ["wall µs/cycle", "client sleeps per cycle", "server µs in commands per cycle"],
    )
    print("\n| placement | aiodlock cycles/s over the floor's |\n|---|---:|")
    for where, values in ratios.items():
        print(f"| {where} | {statistics.median(values):.2f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.costs", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=10000)
    parser.add_argument(
        "--tables",
        default="server,transport,redlock,placement",
        help="which tables, comma-separated (default: all four)",
    )
    args = parser.parse_args(argv)
    tables = set(args.tables.split(","))
    unknown = tables - {"server", "transport", "redlock", "placement"}
    if unknown:
        parser.error(f"unknown table(s): {', '.join(sorted(unknown))}")
    if "server" in tables:
        server_cost(args.rounds, args.cycles)
    if "transport" in tables:
        asyncio.run(transport_cost(args.rounds, args.cycles))
    if "redlock" in tables:
        asyncio.run(redlock_cost(args.rounds, args.cycles))
    if "placement" in tables:
        asyncio.run(placement_cost(args.rounds, args.cycles // 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
