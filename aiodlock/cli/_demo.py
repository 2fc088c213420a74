"""``aiodlock demo``: processes (``aiodlock _demo-worker``) contend for one lock; the report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import anyio

from .. import LockError
from .._types import Capability
from ._common import (
    DEMO_NAMESPACE,
    DEMO_WORKER,
    Exit,
    ExitStatus,
    fmt_seconds,
    make_client,
    resolved_url,
    say,
)
from ._stats import percentile

# On the workers' PYTHONPATH, so that they import this very copy of aiodlock.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Record(NamedTuple):
    worker: int
    token: int
    requested: float
    entered: float
    exited: float


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.2f} ms"


def analyse(records: Sequence[Record], collisions: int) -> dict[str, Any]:
    """Overlaps, token order and latencies of the critical sections of a demo run."""
    entries = sorted(records, key=lambda r: r.entered)
    latest = itertools.accumulate((r.exited for r in entries), max, initial=-math.inf)
    overlaps = collisions + sum(r.entered < end for r, end in zip(entries, latest, strict=False))
    waits = sorted(r.entered - r.requested for r in entries)
    # Hand-off: the lock went from one holder to a worker that was already waiting.
    gaps = sorted(
        b.entered - a.exited
        for a, b in itertools.pairwise(entries)
        if b.worker != a.worker and b.requested < a.exited
    )
    return {
        "acquisitions": len(entries),
        "overlaps": overlaps,
        "marker_collisions": collisions,
        "tokens_increasing": all(a.token < b.token for a, b in itertools.pairwise(entries)),
        "wait_p50": percentile(waits, 50),
        "wait_p99": percentile(waits, 99),
        "handoffs": len(gaps),
        "handoff_p50": percentile(gaps, 50),
        "handoff_p99": percentile(gaps, 99),
    }


async def cmd_demo(args: argparse.Namespace) -> int:
    if not 0 <= args.hold_ms[0] <= args.hold_ms[1]:
        raise Exit(ExitStatus.CONFIG, "demo: --hold-ms needs 0 <= MIN <= MAX")
    args.namespace = args.namespace or DEMO_NAMESPACE
    client = make_client(args)
    shown = client.backend.describe()
    if not client.backend.capabilities & Capability.CROSS_PROCESS:
        raise Exit(
            ExitStatus.CONFIG,
            f"demo: {shown} locks live inside one process; the demo needs a lock service "
            f"shared by processes (the embedded SQLite default, or a server URL)",
        )
    fair = bool(client.backend.capabilities & Capability.FAIR) if args.fair is None else args.fair
    if fair and not client.backend.capabilities & Capability.FAIR:
        raise Exit(
            ExitStatus.CONFIG, f"demo: {shown} offers no fair locks (fair=True); omit --fair"
        )
    async with client:  # creates the database / checks the server before starting workers
        previous = await client.status(args.name)
    if previous is not None and not args.json:
        say(
            f"demo: lock {args.name!r} is held by {previous.owner}; the workers wait for it "
            f"(up to {fmt_seconds(previous.expires_in)})"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aiodlock-demo-") as marker_dir:
        results = await _run_workers(args, marker_dir, fair)
    errors: list[str] = []
    for index, result in enumerate(results):
        if "failed" in result:
            errors.append(f"worker {index} failed: {result['failed']}")
        errors.extend(f"worker {index}: {e}" for e in result["errors"])
    records = [Record(i, *row) for i, result in enumerate(results) for row in result["records"]]
    report = analyse(records, sum(result["collisions"] for result in results))
    per_worker = [len(result["records"]) for result in results]
    report.update(workers=args.workers, per_worker=per_worker, errors=errors, name=args.name)
    # (ZooKeeper and etcd grant every lock in order, whatever --fair says)
    report["fair"] = fair or bool(client.backend.capabilities & Capability.ALWAYS_FAIR)
    report.update(total_time=time.monotonic() - started, url=shown, namespace=args.namespace)
    report["ok"] = bool(records and not errors and not report["overlaps"])
    report["ok"] = report["ok"] and report["tokens_increasing"]
    print(json.dumps(report) if args.json else _demo_report(report), flush=True)
    return ExitStatus.OK if report["ok"] else ExitStatus.FREE


def _demo_report(report: dict[str, Any]) -> str:
    per_worker = report["per_worker"]
    per = " ".join(f"w{i}={n}" for i, n in enumerate(per_worker))
    spread = f" (fewest/most {min(per_worker) / max(per_worker):.2f})" if max(per_worker) else ""
    collisions = report["marker_collisions"]
    processes = "process" if report["workers"] == 1 else "processes"
    kind = "fair" if report["fair"] else "non-fair"
    lines = [
        f"aiodlock demo: {report['workers']} {processes}, one {kind} lock {report['name']!r} "
        f"(namespace {report['namespace']!r}) on {report['url']}",
        f"acquisitions: {report['acquisitions']} total; per worker: {per}{spread}",
        f"overlaps: {report['overlaps']}"
        + (f" (marker file collisions: {collisions})" if collisions else ""),
        "tokens strictly increasing in entry order: "
        + ("yes" if report["tokens_increasing"] else "NO"),
        f"wait time: p50 {_ms(report['wait_p50'])}, p99 {_ms(report['wait_p99'])}",
        f"handoff gap: p50 {_ms(report['handoff_p50'])}, p99 {_ms(report['handoff_p99'])} "
        f"({report['handoffs']} hand-offs to a waiting worker)",
        f"total time: {report['total_time']:.2f} s",
        *(f"error: {e}" for e in report["errors"]),
        "result: OK" if report["ok"] else "result: FAILED",
        "",
        *_legend(report),
    ]
    return "\n".join(lines)


def _legend(report: dict[str, Any]) -> list[str]:
    """What the numbers mean, for the lock the demo ran."""
    if report["fair"]:
        turns = (
            "The lock is fair (FIFO): it is granted in request order, so every worker gets "
            "about as many turns as the others."
        )
    else:
        turns = (
            "The lock is not fair: a worker that releases may take it again before a waiter "
            "in another process learns of the release (waiters of SQLite and MySQL poll), so "
            "one worker may get fewer turns. A waiter that has waited 10 ms takes a place in "
            "line where the service keeps one, which bounds that. --fair grants in order."
        )
    items = [
        "per worker: the turns each process had in the critical section. " + turns,
        "wait time: from asking for the lock to entering, the other workers' turns included.",
        "handoff gap: from one worker's release to the next worker's entry, counted when the "
        "next one was already waiting. It is the time the lock stands idle between two "
        "processes: the release reaching the waiter (a wake-up from the server, or the "
        "waiter's next poll) plus its acquire.",
    ]
    wrap = textwrap.TextWrapper(width=88, initial_indent="- ", subsequent_indent="  ")
    return ["What the numbers mean:", *(wrap.fill(item) for item in items)]


async def _run_workers(
    args: argparse.Namespace, marker_dir: str, fair: bool
) -> list[dict[str, Any]]:
    """Each worker's result (``failed``: the end of its stderr, if it failed)."""
    # The URL goes in the environment, not on the command line, where `ps` shows a password.
    env = dict(os.environ, AIODLOCK_URL=resolved_url(args))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (_PACKAGE_ROOT, env.get("PYTHONPATH"))))
    argv = (sys.executable, "-m", "aiodlock", DEMO_WORKER, "--namespace", args.namespace)
    pipe, spawn = asyncio.subprocess.PIPE, asyncio.create_subprocess_exec
    duration = args.duration if args.duration is not None else (None if args.rounds else 3.0)
    procs: list[asyncio.subprocess.Process] = []
    stage = "start"
    try:
        for _ in range(args.workers):
            procs.append(await spawn(*argv, env=env, stdin=pipe, stdout=pipe, stderr=pipe))
        with anyio.fail_after(60):  # start together: every worker connects before any contends
            for proc in procs:
                assert proc.stdout is not None
                if (await proc.stdout.readline()).strip() != b"ready":
                    why = (await proc.communicate())[1].decode(errors="replace").strip()[-2000:]
                    raise Exit(ExitStatus.UNAVAILABLE, f"demo: a worker failed to start: {why}")
        stage = "finish"
        task = {
            "name": args.name,
            "fair": fair,
            "marker": os.path.join(marker_dir, "inside"),
            "rounds": args.rounds or 0,
            "hold_ms": args.hold_ms,
            "deadline": 0.0 if duration is None else time.monotonic() + duration,
        }
        line = json.dumps(task).encode() + b"\n"
        with anyio.fail_after(60.0 + (duration or 0.0)):
            outputs = await asyncio.gather(*(proc.communicate(line) for proc in procs))
    except TimeoutError:
        raise Exit(
            ExitStatus.FREE, f"demo: the workers did not {stage} in time; they were killed"
        ) from None
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with anyio.CancelScope(shield=True):
                    await proc.wait()
    results: list[dict[str, Any]] = []
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        with contextlib.suppress(ValueError):
            if proc.returncode == 0:
                results.append(json.loads(stdout))
                continue
        failed = stderr.decode(errors="replace").strip()[-2000:] or "no output"
        results.append({"records": [], "collisions": 0, "errors": [], "failed": failed})
    return results


async def cmd_demo_worker(args: argparse.Namespace) -> int:
    """One demo worker: prints ``ready``, reads its task (a JSON line), loops, prints JSON."""
    records: list[tuple[int, float, float, float]] = []
    collisions = 0
    errors: list[str] = []
    async with make_client(args) as client:
        print("ready", flush=True)
        try:
            task = json.loads(await anyio.to_thread.run_sync(sys.stdin.readline))
        except ValueError:
            return ExitStatus.CONFIG
        # A fixed lease: a crashed worker frees the lock within seconds, not watchdog_ttl.
        lock = client.lock(task["name"], ttl=10.0, fair=task["fair"])
        low, high = (ms / 1000 for ms in task["hold_ms"])
        rounds, deadline = task["rounds"], task["deadline"]
        while (not rounds or len(records) < rounds) and time.monotonic() < (deadline or math.inf):
            requested = time.monotonic()
            try:
                lease = await lock.acquire()
            except LockError as exc:
                errors.append(f"acquire: {exc}")
                break
            entered = time.monotonic()
            mine = True
            try:
                os.close(os.open(task["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                collisions += 1  # somebody else is inside
                mine = False
            await asyncio.sleep(random.uniform(low, high))
            if mine:
                try:
                    os.remove(task["marker"])
                except FileNotFoundError:
                    collisions += 1  # somebody else came in and left meanwhile
            exited = time.monotonic()
            try:
                await lock.release()
            except LockError as exc:
                errors.append(f"release: {exc}")
            records.append((lease.token, requested, entered, exited))
    print(json.dumps({"records": records, "collisions": collisions, "errors": errors}))
    return ExitStatus.OK
