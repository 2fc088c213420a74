"""etcd benchmarks: aiodlock's ``etcd://`` against aetcd's Lock, on a fresh single member.

* ``A``: uncontended acquire + release cycles/s of one task (interleaved rounds, median),
  and the raw bound: the cycle's two transactions sent without the library;
* ``B``: the hand-off gap between two clients (two leases, like two processes) taking turns
  on one name: from the holder's release call to the next holder's entry, p50 / p99;
* ``wakeups``: N waiting clients queued on one name take it in turn; the attempts each makes
  are counted, so wake-ups per hand-off = (attempts - N) / N (1.0: one per release);
* ``missed``: rounds of that chain with a bound: a waiter still waiting a second after its
  predecessor released counts as a missed wake-up.

    python -m benchmarks.etcd            # ~1 min, the member's data on /dev/shm
    python -m benchmarks.etcd --disk     # the member's data on disk (an fsync per write)
    python -m benchmarks.etcd --quick    # a smoke run

python-etcd3 (``etcd3``) does not import with protobuf >= 4 and is left out; ``etcdctl
lock`` (a process per cycle) is measured with ``--etcdctl``.  Prints the targets of issue
13 (PASS/FAIL).  The numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiodlock
from aiodlock.backends.etcd import EtcdBackend

from .server import etcd_server, log

perf = time.perf_counter


async def _aiodlock_cycles(url: str, seconds: float) -> float:
    async with aiodlock.connect(url, namespace=f"b{uuid.uuid4().hex[:6]}") as client:
        lock = client.lock("a")
        for _ in range(20):
            async with lock:
                pass
        n, started = 0, perf()
        while perf() - started < seconds:
            async with lock:
                pass
            n += 1
        return n / (perf() - started)


async def _raw_cycles(url: str, seconds: float) -> float:
    """The two transactions of a cycle sent raw on aiodlock's own channel, no library: the
    put of the key with the lease if the line is empty (else, nested: the put if the key is
    absent, with a read of the line's two newest keys), then the delete if the key's
    create_revision is still the one granted."""
    from aiodlock.backends.etcd import _kv as kv

    async with aiodlock.connect(url, namespace=f"r{uuid.uuid4().hex[:6]}") as client:
        backend = client.backend
        assert isinstance(backend, EtcdBackend)
        session = backend._io
        lease = await session.current()
        prefix = backend.keys.prefix("a")
        key = prefix + b"raw"
        put = kv.put(key, b"owner", lease)
        behind = kv.txn(
            [kv.cmp_create(key, 0)],
            [put, kv.newest_two(prefix)],
            [kv.get(key, keys_only=True)],
        )
        empty = kv.cmp_create(prefix, 0, range_end=kv.prefix_end(prefix))
        take = kv.txn([empty], [put], [kv.nested(behind)])
        n, started = 0, perf()
        while perf() - started < seconds:
            got = await session.kv.txn(take, 5.0)
            drop = kv.txn([kv.cmp_create(key, got.revision)], [kv.delete(key)])
            await session.kv.txn(drop, 5.0)
            n += 1
        return n / (perf() - started)


_AETCD = """
import asyncio, sys, time, uuid
import aetcd

async def main(host, port, seconds):
    async with aetcd.Client(host, int(port)) as client:
        lock = client.lock(f"bench-{uuid.uuid4().hex[:6]}".encode(), ttl=30)
        for _ in range(20):
            await lock.acquire()
            await lock.release()
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            await lock.acquire()
            await lock.release()
            n += 1
        print(n / (time.perf_counter() - started))

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def _aetcd_cycles(address: str, seconds: float) -> float | None:
    """aetcd's Lock in a process of its own (its protos clash with etcd3aio's in one); None
    when aetcd is not installed (``pip install -e ".[bench]"``)."""
    host, port = address.rsplit(":", 1)
    done = subprocess.run(
        [sys.executable, "-c", _AETCD, host, port, str(seconds)],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        if "No module named 'aetcd'" in done.stderr:
            return None
        raise RuntimeError(f"the aetcd peer failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def _etcdctl_cycles(endpoint: str, count: int) -> float:
    started = perf()
    for _ in range(count):
        subprocess.run(
            ["etcdctl", f"--endpoints={endpoint}", "lock", "bench-ctl", "true"],
            check=True,
            capture_output=True,
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin:/usr/local/bin"},
        )
    return count / (perf() - started)


async def _handoff(url: str, turns: int) -> list[float]:
    """Two clients alternate on one name: gaps (s) from a release call to the next entry."""
    ns = f"b{uuid.uuid4().hex[:6]}"
    async with aiodlock.connect(url, namespace=ns) as a, aiodlock.connect(url, namespace=ns) as b:
        gaps: list[float] = []
        released = 0.0

        async def side(client: aiodlock.Client, count: int) -> None:
            nonlocal released
            lock = client.lock("b")
            for _ in range(count):
                async with lock:
                    if released:
                        gaps.append(perf() - released)
                    await asyncio.sleep(0.001)
                    released = perf()
                await asyncio.sleep(0)  # (the other side's attempt is on its way)

        await asyncio.gather(side(a, turns), side(b, turns))
        return gaps[5:]


async def _wakeups(url: str, waiters: int, bound: float) -> tuple[float, int]:
    """N clients queue behind a holder and take the name in turn: (wake-ups per hand-off,
    waiters that waited more than ``bound`` after their predecessor's release)."""
    ns = f"b{uuid.uuid4().hex[:6]}"
    attempts: dict[str, int] = {}
    original = EtcdBackend.try_acquire

    async def counted(self: EtcdBackend, request: Any, **kw: Any) -> Any:
        attempts[request.owner] = attempts.get(request.owner, 0) + 1
        return await original(self, request, **kw)

    clients = [aiodlock.connect(url, namespace=ns) for _ in range(waiters + 1)]
    for client in clients:
        await client.open()
    try:
        holder = clients[0].lock("w")
        await holder.acquire()
        EtcdBackend.try_acquire = counted  # type: ignore[method-assign]
        released: list[float] = []
        missed = 0

        async def wait(client: aiodlock.Client) -> None:
            nonlocal missed
            async with client.lock("w", timeout=60):
                if released and perf() - released[-1] > bound:
                    missed += 1
                await asyncio.sleep(0.001)
                released.append(perf())

        tasks = [asyncio.create_task(wait(c)) for c in clients[1:]]
        while (
            await clients[0].status("w") or aiodlock.LockStatus("", "", 0, None, 0)
        ).waiters != waiters:
            await asyncio.sleep(0.01)
        released.append(perf())
        await holder.release()
        await asyncio.gather(*tasks)
    finally:
        EtcdBackend.try_acquire = original  # type: ignore[method-assign]
        for client in clients:
            await client.close()
    total = sum(attempts.values())
    return (total - waiters) / waiters, missed


async def _queued(client: aiodlock.Client, waiters: int) -> bool:
    status = await client.status("w")
    return status is not None and status.waiters == waiters


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> int:
    with etcd_server(not args.disk) as server:
        url, address = server.url, server.address
        seconds = 0.3 if args.quick else args.a_seconds
        rounds = 1 if args.quick else args.a_rounds
        ours: list[float] = []
        peer: list[float] = []
        raw: list[float] = []
        for _ in range(rounds):  # interleaved, so a busy moment hurts both
            ours.append(await _aiodlock_cycles(url, seconds))
            raw.append(await _raw_cycles(url, seconds))
            other = _aetcd_cycles(address, seconds)
            if other is not None:
                peer.append(other)
        a_ours = statistics.median(ours)
        a_raw = statistics.median(raw)
        a_peer = statistics.median(peer) if peer else None
        shown = "not installed" if a_peer is None else f"{a_peer:.0f}"
        log(f"A aiodlock {a_ours:.0f} cycles/s, aetcd {shown} (median of {rounds})")
        if a_peer is not None:
            log(
                f"A raw bound (the two transactions, no library) {a_raw:.0f} cycles/s, "
                f"{a_raw / a_peer:.2f}x aetcd; aiodlock {a_ours / a_peer:.2f}x"
            )
        if args.etcdctl:
            log(f"A etcdctl lock {_etcdctl_cycles(server.client_url, 20):.0f} cycles/s")
        gaps = await _handoff(url, 30 if args.quick else args.turns)
        p50, p99 = _q(gaps, 0.5) * 1e3, _q(gaps, 0.99) * 1e3
        log(f"B hand-off gap p50 {p50:.2f} ms, p99 {p99:.2f} ms ({len(gaps)} hand-offs)")
        per: dict[int, float] = {}
        for n in (1, 10) if args.quick else (1, 10, 100):
            per[n], _ = await _wakeups(url, n, bound=1.0)
            log(f"wake-ups per hand-off with {n} waiters: {per[n]:.2f}")
        missed = 0
        for _ in range(2 if args.quick else 10):
            _, m = await _wakeups(url, 10, bound=1.0)
            missed += m
        log(f"missed wake-ups in {2 if args.quick else 10} rounds of 10 waiters: {missed}")
    targets = [
        ("A >= 1.5x aetcd", None if a_peer is None else a_ours >= 1.5 * a_peer),
        ("B p99 < 10 ms", p99 < 10.0),
        ("1.0 wake-up per hand-off, 1..100 waiters", all(v == 1.0 for v in per.values())),
        ("no missed wake-up", missed == 0),
    ]
    for label, ok in targets:
        print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}  {label}")
    if args.json:  # (read by benchmarks.suite)
        doc = {
            "A": {"aiodlock": a_ours, "aetcd": a_peer, "raw": a_raw},
            "B": {"aiodlock": {"p50_ms": p50, "p99_ms": p99, "n": len(gaps)}},
            "wakeups_per_handoff": per,
            "missed": missed,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")  # noqa: ASYNC240
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.etcd", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--a-seconds", type=float, default=2.0, help="A: one round's length")
    parser.add_argument("--a-rounds", type=int, default=5, help="A: interleaved rounds")
    parser.add_argument("--turns", type=int, default=300, help="B: turns per client")
    parser.add_argument("--etcdctl", action="store_true", help="A: also etcdctl lock")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH")
    parser.add_argument(
        "--disk", action="store_true", help="the member's data on disk, not /dev/shm"
    )
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
