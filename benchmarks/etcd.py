"""etcd benchmarks: aiodlock's ``etcd://`` against aetcd's and python-etcd3's Lock recipes,
with ``etcdctl lock`` for reference, on a fresh single etcd member on a free loopback port
(``tests/servers.py``).

Every adapter runs in a worker process of its own (``--worker``), started once and told what
to run over its stdin: python-etcd3's generated protobuf code needs the pure-Python protobuf
runtime, which must not slow the others down, and no library's imports or garbage touch
another's numbers.

* A: one task, one name, acquire+release cycles, in short slices, one per adapter per round
  in a rotating order; the ratio to the best peer is taken per round, its median reported.
* B: 8 tasks of one client contend for one name (:func:`benchmarks.workloads.contention`):
  the hand-off gap.
* W (wake-ups): N clients (N leases, like N processes) queue on one name and take turns,
  ``--w-rounds`` acquisitions each; etcd's own counter of the events it sent to watchers
  (``etcd_debugging_mvcc_events_total``) gives the wake-ups per hand-off, and the longest
  hand-off gap shows a missed wake-up (a waiter that slept until a timeout).

    python -m benchmarks.etcd            # everything (~2 minutes)
    python -m benchmarks.etcd --quick    # a smoke run (numbers are noise)

aetcd comes with the ``bench`` extra; python-etcd3 pins protobuf 3.6 and grpcio 1.27, which
would break etcd3aio, so install it by hand: ``pip install --no-deps etcd3 tenacity six``.
A peer that does not import is skipped.

Writes ``benchmarks/results/<name>.json`` and ``.md`` (name: ``etcd``) and prints the targets
of issue 13 (PASS/FAIL).  The numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, ClassVar

from . import workloads
from .adapters import Adapter, AiodlockAdapter
from .runner import (
    RESULTS_DIR,
    _csv,
    _loadavg,
    save_run,
    settle_side_args,
    side_report_head,
    side_rows,
    target_lines,
)
from .server import ROOT, etcd_server, log

__all__ = ["ADAPTERS", "main"]

perf = time.perf_counter
LEASE = 30
#: A hand-off gap longer than this is a missed wake-up (the waiter slept until a timeout).
MISSED_AFTER = 1.0


def _endpoint(url: str | None) -> tuple[str, int]:
    assert url is not None
    host, port = url.split("://", 1)[1].split("/", 1)[0].split(",")[0].rsplit(":", 1)
    return host, int(port)


class AiodlockEtcd(AiodlockAdapter):
    """aiodlock through its public API on ``etcd://``."""

    name = "aiodlock"
    library = "aiodlock (etcd://)"
    packages = ("aiodlock", "etcd3aio")
    needs_redis = False
    supports_fair = True


class AetcdLock(Adapter):
    """aetcd's ``client.lock(key, ttl)``: a lease per acquisition, and every waiter watches
    the one key (each release wakes them all)."""

    name = "aetcd"
    library = "aetcd Lock"
    role = "peer"
    packages = ("aetcd",)
    needs_redis = False

    async def open(self) -> None:
        import aetcd

        host, port = _endpoint(self.url)
        self.client = aetcd.Client(host=host, port=port)
        await self.client.connect()

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return self.client.lock(f"/aetcd/{name}".encode(), ttl=LEASE)

    async def acquire(self, lock: Any) -> float | None:
        await lock.acquire(timeout=None)
        return None

    async def release(self, lock: Any) -> None:
        await lock.release()

    async def close(self) -> None:
        await self.client.close()

    async def abort(self, name: str) -> None:
        await self.client.delete(f"/aetcd/{name}".encode())


class Etcd3Lock(Adapter):
    """python-etcd3's ``client.lock(name, ttl)`` (sync): its calls run in a thread pool."""

    name = "python-etcd3"
    library = "python-etcd3 Lock (sync, in threads)"
    role = "peer"
    packages = ("etcd3",)
    needs_redis = False
    #: its generated code needs the pure-Python protobuf runtime (set for its worker only)
    environment: ClassVar[dict[str, str]] = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}

    async def open(self) -> None:
        import etcd3

        host, port = _endpoint(self.url)
        self.client = etcd3.client(host=host, port=port)
        self.pool = concurrent.futures.ThreadPoolExecutor(64)

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return self.client.lock(name, ttl=LEASE)

    async def acquire(self, lock: Any) -> float | None:
        def take() -> float:
            lock.acquire(timeout=None)
            return perf()

        return await asyncio.get_running_loop().run_in_executor(self.pool, take)

    async def release(self, lock: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, lock.release)

    async def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()


class EtcdctlLock(Adapter):
    """``etcdctl lock NAME true``: a process per cycle (for reference; A only)."""

    name = "etcdctl"
    library = "etcdctl lock (a process per cycle)"
    role = "peer"
    needs_redis = False
    can_wait = False

    async def open(self) -> None:
        host, port = _endpoint(self.url)
        self.endpoint = f"http://{host}:{port}"

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return name

    async def acquire(self, lock: Any) -> float | None:
        command = ["etcdctl", f"--endpoints={self.endpoint}", "lock", f"etcdctl-{lock}", "true"]
        proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.DEVNULL)
        if await proc.wait():
            raise RuntimeError(f"etcdctl lock exited with {proc.returncode}")
        return None

    async def release(self, lock: Any) -> None:
        pass  # (the process released it when `true` ended)


ADAPTERS: dict[str, type[Adapter]] = {
    a.name: a for a in (AiodlockEtcd, AetcdLock, Etcd3Lock, EtcdctlLock)
}


# -- the worker process: one adapter, commands on stdin, one JSON line per answer -------------


async def _worker(adapter_name: str, url: str) -> None:
    loop = asyncio.get_running_loop()
    adapter = ADAPTERS[adapter_name](url)
    await adapter.open()
    print(json.dumps({"ready": True}), flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = json.loads(line)
        kind = command.pop("kind")
        if kind == "A":
            result = await workloads.single(adapter, **command)
        elif kind == "B":
            result = await workloads.contention(adapter, **command)
        else:
            result = await _wakeups(adapter_name, url, **command)
        print(json.dumps(result), flush=True)
    await adapter.close()


async def _wakeups(adapter_name: str, url: str, *, name: str, clients: int, rounds: int) -> Any:
    """``clients`` clients queue on ``name``; each takes it ``rounds`` times (entry and exit
    times are returned for the hand-off gaps)."""
    adapters = [ADAPTERS[adapter_name](url) for _ in range(clients)]
    await asyncio.gather(*(a.open() for a in adapters))
    turns: list[tuple[float, float]] = []

    async def client(adapter: Adapter) -> None:
        lock = adapter.new_lock(name)
        for _ in range(rounds):
            granted = await adapter.acquire(lock)
            entered = perf() if granted is None else granted
            await asyncio.sleep(0.001)
            turns.append((entered, perf()))
            await adapter.release(lock)

    try:
        await asyncio.gather(*(client(a) for a in adapters))
    finally:
        await asyncio.gather(*(a.close() for a in adapters), return_exceptions=True)
    turns.sort()
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(turns)]
    return {"handoffs": len(gaps), "gaps": gaps}


class Worker:
    """The parent's handle on one adapter's worker process."""

    def __init__(self, adapter: type[Adapter], url: str) -> None:
        env = {**os.environ, **getattr(adapter, "environment", {})}
        command = [sys.executable, "-m", "benchmarks.etcd", "--worker", adapter.name]
        self.proc = subprocess.Popen(
            [*command, "--url", url], cwd=ROOT, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.ask_raw(None)

    def ask_raw(self, command: dict[str, Any] | None) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, kind: str, **options: Any) -> Any:
        return self.ask_raw({"kind": kind, **options})

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _events(client_url: str) -> int:
    """etcd's count of the events it has sent to watchers."""
    with urllib.request.urlopen(client_url + "/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_events_total "):
                return int(float(line.split()[1]))
    raise RuntimeError("etcd_debugging_mvcc_events_total is missing from /metrics")


def _run(args: argparse.Namespace, url: str, client_url: str) -> dict[str, Any]:
    results: dict[str, Any] = {"A": {}, "A_rounds": [], "B": {}, "W": {}}
    workers = {name: Worker(ADAPTERS[name], url) for name in args.adapters}
    try:
        for worker in workers.values():
            worker.ask("A", name=f"warm-{uuid.uuid4().hex[:6]}", seconds=0.3)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in workers}
        names = list(workers)
        for r in range(args.a_rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            rates = {}
            for name in order:
                res = workers[name].ask("A", name=f"a-{name}-{r}", seconds=args.a_seconds)
                runs[name].append(res)
                rates[name] = res["cycles_per_s"]
            results["A_rounds"].append(rates)
            log(f"A round {r + 1}: " + ", ".join(f"{n} {v:.0f}/s" for n, v in rates.items()))
        for name, rows in runs.items():
            rates = [row["cycles_per_s"] for row in rows]
            results["A"][name] = {
                "cycles_per_s": round(statistics.median(rates), 1),
                "cycle_p50_ms": statistics.median(row["cycle"]["p50_ms"] for row in rows),
            }
        for name, worker in workers.items():
            if not ADAPTERS[name].can_wait:
                continue
            res = worker.ask(
                "B", name=f"b-{name}", workers=args.b_workers, seconds=args.b_seconds,
                hold=args.hold_ms / 1000, settle=0.5,
            )  # fmt: skip
            results["B"][name] = res
            log(f"B {name}: {res['acquisitions_per_s']}/s, gap {res['handoff_gap']}")
        for name in args.w_adapters:
            for clients in args.w_clients:
                before = _events(client_url)
                res = workers[name].ask("W", name=f"w-{name}-{clients}", clients=clients,
                                        rounds=args.w_rounds)  # fmt: skip
                events = _events(client_url) - before
                gaps = res["gaps"]
                row = {
                    "clients": clients,
                    "handoffs": res["handoffs"],
                    "events_per_handoff": round(events / max(res["handoffs"], 1), 3),
                    "gap_p50_ms": round(statistics.median(gaps) * 1000, 3) if gaps else None,
                    "gap_max_ms": round(max(gaps, default=0.0) * 1000, 3),
                    "missed": sum(1 for g in gaps if g > MISSED_AFTER),
                }
                results["W"].setdefault(name, []).append(row)
                log(f"W {name} x{clients}: {row}")
    finally:
        for worker in workers.values():
            worker.close()
    return results


def _targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def judge(goal: str, ok: bool | None, measured: str) -> None:
        status = "N/A" if ok is None else ("PASS" if ok else "FAIL")
        out.append({"goal": goal, "status": status, "measured": measured})

    rounds = results["A_rounds"]
    peers = [n for n in results["A"] if n != "aiodlock"]
    ratios = [
        r["aiodlock"] / max(r[p] for p in peers)
        for r in rounds
        if "aiodlock" in r and any(p in r for p in peers)
    ]
    ratio = statistics.median(ratios) if ratios else None
    judge(
        "A: uncontended cycles/s >= 1.5x the best peer",
        None if ratio is None else ratio >= 1.5,
        "n/a" if ratio is None else f"{ratio:.2f}x (median of per-round ratios)",
    )
    b = results["B"].get("aiodlock")
    p99 = None if b is None else b["handoff_gap"]["p99_ms"]
    judge("B: hand-off gap p99 < 10 ms", None if p99 is None else p99 < 10, f"{p99} ms")
    w = results["W"].get("aiodlock", [])
    per = [row["events_per_handoff"] for row in w]
    judge(
        "W: one wake-up per hand-off from 1 to 100 waiters",
        None if not per else all(0.95 <= p <= 1.05 for p in per),
        ", ".join(f"x{row['clients']}: {row['events_per_handoff']}" for row in w) or "n/a",
    )
    missed = sum(row["missed"] for row in w)
    judge("W: no missed wake-up", None if not w else missed == 0, f"{missed} missed")
    return out


def _markdown(doc: dict[str, Any]) -> str:
    meta, res = doc["meta"], doc["results"]
    lines = side_report_head("etcd", "etcd", meta)
    lines += [
        "| adapter | A: cycles/s | A: cycle p50 ms | B: acq/s | B: gap p50 ms | B: gap p99 ms "
        "| B: same owner |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, a, b in side_rows(res, ADAPTERS):
        gap = b.get("handoff_gap", {})
        lines.append(
            f"| {name} | {a.get('cycles_per_s', '')} | {a.get('cycle_p50_ms', '')} | "
            f"{b.get('acquisitions_per_s', '')} | {gap.get('p50_ms', '')} | "
            f"{gap.get('p99_ms', '')} | {b.get('same_owner_share', '')} |"
        )
    lines += ["", "| adapter | waiters | hand-offs | events per hand-off | gap p50 ms | "
              "gap max ms | missed |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, rows in res["W"].items():
        for row in rows:
            lines.append(
                f"| {name} | {row['clients']} | {row['handoffs']} | "
                f"{row['events_per_handoff']} | {row['gap_p50_ms']} | {row['gap_max_ms']} | "
                f"{row['missed']} |"
            )
    return "\n".join([*lines, "", "Targets:", *target_lines(doc), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.etcd", description=__doc__)
    parser.add_argument("--name")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--adapters", type=_csv, help=f"from {', '.join(ADAPTERS)}")
    parser.add_argument("--w-adapters", type=_csv, help="the adapters of W (aiodlock, aetcd)")
    parser.add_argument("--w-clients", type=lambda s: [int(x) for x in _csv(s)])
    parser.add_argument("--w-rounds", type=int)
    parser.add_argument("--a-seconds", type=float)
    parser.add_argument("--a-rounds", type=int)
    parser.add_argument("--b-seconds", type=float)
    parser.add_argument("--b-workers", type=int)
    parser.add_argument("--hold-ms", type=float)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args.worker, args.url))
        return 0
    defaults: dict[str, Any] = {
        "adapters": list(ADAPTERS), "w_adapters": ["aiodlock", "aetcd"],
        "w_clients": [1, 10, 100], "w_rounds": 10, "a_seconds": 2.0, "a_rounds": 5,
        "b_seconds": 5.0, "b_workers": 8, "hold_ms": 0.0,
    }  # fmt: skip
    if args.quick:
        defaults |= {"a_seconds": 0.3, "a_rounds": 2, "b_seconds": 1.0, "w_clients": [1, 10],
                     "w_rounds": 3}  # fmt: skip
    args = settle_side_args(parser, args, defaults, ADAPTERS, "etcd")
    args.w_adapters = [a for a in args.w_adapters if a in args.adapters]
    for name in list(args.adapters):
        why = _missing(ADAPTERS[name])
        if why:
            log(f"skipping {name}: {why}")
            args.adapters.remove(name)
    loadavg = _loadavg()
    with etcd_server() as server:
        results = _run(args, server.url, server.client_url)
        packages = [p for a in args.adapters for p in ADAPTERS[a].packages]
        text = save_run(
            out=args.out, name=args.name, module="benchmarks.etcd", argv=argv,
            server=f"etcd on {server.client_url} (one member)", packages=packages,
            loadavg_before=loadavg,
            results=results, targets=_targets, markdown=_markdown,
        )  # fmt: skip
    print(text)
    return 0


def _missing(adapter: type[Adapter]) -> str | None:
    for module in adapter.packages:
        env = getattr(adapter, "environment", {})
        probe = subprocess.run(
            [sys.executable, "-c", f"import {module}"], env={**os.environ, **env},
            capture_output=True, text=True,
        )  # fmt: skip
        if probe.returncode:
            return f"{module} does not import: {probe.stderr.strip().splitlines()[-1:]}"
    if adapter is EtcdctlLock and shutil.which("etcdctl") is None:
        return "etcdctl is not installed"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
