"""Cross-process fairness: P processes x T tasks contend for ONE name.

Each process (``python -m benchmarks.crossprocess --worker``, started here) is one aiodlock
client; each of its T asyncio tasks makes N acquisitions of the name, holding it
``--hold-ms`` each time, with the default ``fair=False`` (``--fair``: ``fair=True``).  The
workers connect and warm up, then start at one moment of ``time.monotonic()``
(CLOCK_MONOTONIC: one clock for every process of a Linux host) and record ``(task,
requested, entered, exited)`` per acquisition.  Reported: the hand-off gap (one holder's
exit to the next holder's entry, when the next was waiting), the waits, the owner changes
that cross processes, each process's acquisitions when the first process finished all of
its own (and their min/max ratio), and a verdict against ``TARGET``.

    python -m benchmarks.crossprocess --backend redis [--fair]   # 4 x 2 tasks x 100, 1 ms
    python -m benchmarks.crossprocess --backend sqlite --save    # also results/*.json, .md
    python -m benchmarks.crossprocess --backend mysql-row        # (mysql, mysql-named too)
    python -m benchmarks.crossprocess --backend etcd             # (postgres too)

Servers are fresh, on free loopback ports (``benchmarks/server.py``); SQLite uses a file in
a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .server import (
    ROOT,
    etcd_server,
    log,
    mariadb_server,
    redis_masters,
    redis_server,
    temporary_server,
    zookeeper_server,
)
from .side import RESULTS_DIR, loadavg, save_run, side_report_head
from .stats import summary_ms

__all__ = ["BACKENDS", "TARGET", "analyse", "main", "run"]

BACKENDS = (
    "sqlite",
    "redis",
    "redlock",
    "zookeeper",
    "etcd",
    "mysql",
    "mysql-named",
    "mysql-row",
    "postgres",
)
MIN_SHARE, MAX_WAIT_MS = 0.5, 100.0
TARGET = (
    "every process has at least half as many acquisitions as the busiest one by the time "
    "the first process finishes, and no wait is longer than 100 ms"
)


@contextlib.contextmanager
def backend_url(backend: str, *, force_sync: bool = True) -> Iterator[tuple[str, str]]:
    """``(url, description)`` of a fresh server (or SQLite file) for ``backend``."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="aiodlock-bench-xproc-") as tmp:
            yield f"sqlite:///{tmp}/locks.db", "a SQLite file in a temporary directory"
    elif backend == "redis":
        with redis_server() as server:
            yield server.url, f"redis-server on {server.address} (loopback, no persistence)"
    elif backend == "redlock":
        with redis_masters(5) as group:
            yield "redlock://" + group.hosts, "5 redis-servers on loopback (no persistence)"
    elif backend == "zookeeper":
        with zookeeper_server(force_sync) as server:
            sync = "yes" if force_sync else "no"
            yield server.url, f"ZooKeeper on {server.address} (standalone, forceSync={sync})"
    elif backend == "etcd":
        with etcd_server(tmpfs=True) as server:
            yield server.url, f"etcd on {server.address} (single member, data on /dev/shm)"
    elif backend == "postgres":
        with temporary_server(
            "postgres", lambda servers, base: servers.PostgresServer(base), "aiodlock-bench-pg-"
        ) as server:
            yield server.url, f"PostgreSQL on {server.address} (loopback, fsync off)"
    elif backend.startswith("mysql"):
        strategy = backend.partition("-")[2] or "table"
        with mariadb_server() as server:
            yield (
                f"{server.url}?strategy={strategy}",
                f"MariaDB on {server.address} (loopback), strategy={strategy}",
            )
    else:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")


# -- the worker process ----------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import aiodlock

    client = aiodlock.connect(args.url)
    await client.open()
    try:
        client.lock(args.lock_name, fair=args.fair)  # Unsupported shows before the start
        warm = client.lock(f"{args.lock_name}-warm-{os.getpid()}")
        for _ in range(3):  # connections, scripts, lazy imports
            await warm.acquire()
            await warm.release()
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await asyncio.sleep(max(float(line) - time.monotonic(), 0.0))
        started = time.monotonic()
        records: list[tuple[int, float, float, float]] = []

        async def task(index: int) -> None:
            lock = client.lock(args.lock_name, fair=args.fair)
            for _ in range(args.acquisitions):
                requested = time.monotonic()
                await lock.acquire()
                entered = time.monotonic()
                await asyncio.sleep(args.hold_ms / 1000)
                exited = time.monotonic()
                await lock.release()
                records.append((index, requested, entered, exited))

        outcomes = await asyncio.gather(
            *(task(i) for i in range(args.tasks)), return_exceptions=True
        )
    finally:
        await client.close()
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    return {"pid": os.getpid(), "started": started, "records": records, "errors": errors}


# -- the coordinator ---------------------------------------------------------------------------


def _spawn(url: str, name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the workers, start them together once all are ready, collect their records."""
    command = [sys.executable, "-m", "benchmarks.crossprocess", "--worker", "--url", url]
    command += ["--lock-name", name, "--tasks", str(args.tasks)]
    command += ["--acquisitions", str(args.acquisitions), "--hold-ms", str(args.hold_ms)]
    command += ["--fair"] if args.fair else []
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
            )
            for _ in range(args.processes)
        ]

        def kill() -> None:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()

        # (callbacks run last-in first-out: the timer stops, stragglers are killed, then
        # each Popen closes its pipes and waits)
        stack.callback(kill)
        killer = threading.Timer(args.timeout, kill)
        killer.start()
        stack.callback(killer.cancel)
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                error = json.loads(line).get("error") if line.startswith("{") else line
                raise RuntimeError(f"worker {proc.pid} did not start: {error or 'no answer'}")
        start_at = time.monotonic() + 0.25
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start_at!r}\n")
            proc.stdin.flush()
        docs = []
        for proc in procs:
            out, _ = proc.communicate()
            last = out.strip().splitlines()[-1] if out.strip() else ""
            if proc.returncode or not last.startswith("{"):
                raise RuntimeError(f"worker {proc.pid} exited {proc.returncode}: {last!r}")
            docs.append(json.loads(last) | {"start_at": start_at})
        return docs


def analyse(docs: Sequence[dict[str, Any]], *, tasks: int, acquisitions: int) -> dict[str, Any]:
    """The report of one run from the workers' records (see the module's docstring)."""
    rows = sorted(
        ((p, t, r, e, x) for p, doc in enumerate(docs) for t, r, e, x in doc["records"]),
        key=lambda row: row[3],
    )
    start = min(doc["start_at"] for doc in docs)
    gaps: list[float] = []
    cross_gaps: list[float] = []
    owner_changes = cross_changes = overlaps = 0
    for (p0, t0, _, _, x0), (p1, t1, r1, e1, _) in itertools.pairwise(rows):
        overlaps += e1 < x0
        owner_changes += (p0, t0) != (p1, t1)
        cross_changes += p0 != p1
        if r1 < x0:  # the next holder was already waiting when the last one left
            gaps.append(e1 - x0)
            if p0 != p1:
                cross_gaps.append(e1 - x0)
    waits = [e - r for _, _, r, e, _ in rows]
    per_process = []
    for p, doc in enumerate(docs):
        mine = [row for row in rows if row[0] == p]
        done = len(mine) == tasks * acquisitions and not doc["errors"]
        per_process.append(
            {
                "pid": doc["pid"],
                "acquisitions": len(mine),
                "finished_s": round(max(x for *_, x in mine) - start, 4) if done else None,
                "longest_wait_ms": round(max((e - r for *_, r, e, _ in mine), default=0) * 1e3, 3),
                "start_skew_ms": round((doc["started"] - start) * 1000, 3),
                "errors": doc["errors"],
            }
        )
    finished = [p["finished_s"] for p in per_process if p["finished_s"] is not None]
    first = min(finished) + start if finished else None
    for p, row in enumerate(per_process):
        row["at_first_finish"] = sum(
            1 for q, *_, e, _ in rows if q == p and first is not None and e <= first
        )
    shares = [row["at_first_finish"] for row in per_process]
    ratio = round(min(shares) / max(shares), 4) if first is not None and max(shares) else None
    wait = summary_ms(waits)
    passed = ratio is not None and ratio >= MIN_SHARE and (wait["max_ms"] or 0) <= MAX_WAIT_MS
    return {
        "acquisitions": len(rows),
        "expected": len(docs) * tasks * acquisitions,
        "seconds": round(rows[-1][4] - start, 4) if rows else 0.0,
        "handoff_gap": summary_ms(gaps),
        "cross_process_handoff_gap": summary_ms(cross_gaps),
        "wait": wait,
        "owner_changes": owner_changes,
        "cross_process_owner_changes": cross_changes,
        "first_finish_s": None if first is None else round(first - start, 4),
        "share_at_first_finish": shares,
        "share_min_max_ratio": ratio,
        "overlapping_intervals": overlaps,
        "per_process": per_process,
        "verdict": "PASS" if passed else "FAIL",
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start a server for ``args.backend``, run the workload, return :func:`analyse`'s report
    with the run's settings (``args`` as :func:`parse_args` makes them)."""
    with backend_url(args.backend, force_sync=args.force_sync == "yes") as (url, server):
        docs = _spawn(url, f"xproc-{uuid.uuid4().hex[:8]}", args)
    keys = ("backend", "processes", "tasks", "acquisitions", "hold_ms", "fair")
    config = {key: getattr(args, key) for key in keys} | {"server": server}
    return {"config": config, **analyse(docs, tasks=args.tasks, acquisitions=args.acquisitions)}


def _ms(summary: dict[str, Any]) -> str:
    return f"p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms (n={summary['n']})"


def report_lines(res: dict[str, Any]) -> list[str]:
    """The report as markdown lines (stdout and the saved ``.md``)."""
    c = res["config"]
    lines = [
        f"### Cross-process: {c['backend']}, {c['processes']} processes x {c['tasks']} tasks x "
        f"{c['acquisitions']} acquisitions, hold {c['hold_ms']} ms, fair={c['fair']}",
        "",
        f"- server: {c['server']}",
        f"- acquisitions: {res['acquisitions']} of {res['expected']} in {res['seconds']} s; "
        f"owner changes {res['owner_changes']}, across processes "
        f"{res['cross_process_owner_changes']}; overlapping intervals "
        f"{res['overlapping_intervals']}",
        f"- hand-off gap (next holder already waiting): {_ms(res['handoff_gap'])}; "
        f"across processes {_ms(res['cross_process_handoff_gap'])}",
        f"- wait: {_ms(res['wait'])}, longest {res['wait']['max_ms']} ms",
        f"- first process finished at {res['first_finish_s']} s; acquisitions per process by "
        f"then: {'/'.join(map(str, res['share_at_first_finish']))}, min/max "
        f"{res['share_min_max_ratio']}",
        "",
        "| process | at first finish | total | finished at s | longest wait ms | errors |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for i, p in enumerate(res["per_process"]):
        lines.append(
            f"| {i} | {p['at_first_finish']} | {p['acquisitions']} | {p['finished_s']} "
            f"| {p['longest_wait_ms']} | {'; '.join(p['errors'])} |"
        )
    return [*lines, "", f"Verdict: {res['verdict']} (target: {TARGET})"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.crossprocess", description=__doc__)
    p.add_argument("--backend", choices=BACKENDS, default="sqlite")
    p.add_argument("--fair", action="store_true", help="fair=True (default: fair=False)")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--tasks", type=int, default=2, help="asyncio tasks per process")
    p.add_argument("--acquisitions", type=int, default=100, help="per task")
    p.add_argument("--hold-ms", type=float, default=1.0)
    p.add_argument("--force-sync", choices=("yes", "no"), default="yes", help="ZooKeeper's")
    p.add_argument("--timeout", type=float, default=600.0, help="kill the workers after this")
    p.add_argument("--save", action="store_true", help="also write <out>/<name>.json and .md")
    p.add_argument("--name", help="results file stem (crossprocess-BACKEND[-fair])")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--lock-name", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        try:
            print(json.dumps(asyncio.run(_worker(args))), flush=True)
        except Exception as exc:
            print(json.dumps({"error": repr(exc)}), flush=True)
            return 1
        return 0
    loadavg_before = loadavg()
    log(f"cross-process: {args.backend}, {args.processes} x {args.tasks} tasks")
    res = run(args)
    if not args.save:
        print("\n".join(report_lines(res)))
        return 0
    name = args.name or f"crossprocess-{args.backend}{'-fair' if args.fair else ''}"
    text = save_run(
        out=args.out,
        name=name,
        module="benchmarks.crossprocess",
        argv=argv,
        server=res["config"]["server"],
        packages=("aiodlock", "redis", "hiredis", "aiozk"),
        loadavg_before=loadavg_before,
        results=res,
        targets=lambda r: [{"goal": TARGET, "status": r["verdict"], "measured": ""}],
        markdown=lambda doc: "\n".join(
            [*side_report_head("Cross-process", "server", doc["meta"]), *report_lines(res), ""]
        ),
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
