"""``aiodlock demo``: N worker processes contend for one lock; the report checks them.

The demo (``_cmd_demo``) starts the workers as ``python -m aiodlock _demo-worker ...``
(``_cmd_demo_worker``), starts them together, gathers their records and reports overlaps,
token order, wait times and hand-off gaps (:func:`analyse`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import anyio

import aiodlock

from .. import LockError
from .._types import Capability
from ._common import (
    DEMO_NAMESPACE,
    EX_CONFIG,
    EX_FREE,
    EX_OK,
    EX_UNAVAILABLE,
    _Exit,
    _fmt_seconds,
    _make_client,
    _resolved_url,
    _say,
)
from ._stats import percentile

# Put on the demo workers' PYTHONPATH so they import this very copy of aiodlock: the
# directory that holds the ``aiodlock`` package (wherever this module sits inside it).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aiodlock.__file__)))


@dataclasses.dataclass
class _Record:
    worker: int
    token: int
    requested: float
    entered: float
    exited: float


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.2f} ms"


def analyse(records: Sequence[_Record], collisions: int) -> dict[str, Any]:
    """Overlaps, token order and latencies of the critical sections of a demo run."""
    entries = sorted(records, key=lambda r: r.entered)
    overlaps = collisions
    latest_exit = -math.inf
    for record in entries:
        if record.entered < latest_exit:
            overlaps += 1
        latest_exit = max(latest_exit, record.exited)
    tokens = [r.token for r in entries]
    increasing = all(a < b for a, b in itertools.pairwise(tokens))
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
        "tokens_increasing": increasing,
        "wait_p50": percentile(waits, 50),
        "wait_p99": percentile(waits, 99),
        "handoffs": len(gaps),
        "handoff_p50": percentile(gaps, 50),
        "handoff_p99": percentile(gaps, 99),
    }


async def _cmd_demo(args: argparse.Namespace) -> int:
    low, high = args.hold_ms
    if not 0 <= low <= high:
        raise _Exit(EX_CONFIG, "demo: --hold-ms needs 0 <= MIN <= MAX")
    url = _resolved_url(args)
    namespace = args.namespace or DEMO_NAMESPACE
    duration = args.duration if args.duration is not None else (None if args.rounds else 3.0)
    client = _make_client(args, namespace=namespace)
    if not client.backend.capabilities & Capability.CROSS_PROCESS:
        raise _Exit(
            EX_CONFIG,
            f"demo: {client.backend.describe()} locks live inside one process; the demo "
            f"needs a lock service shared by processes (the embedded SQLite default, or a "
            f"server URL)",
        )
    shown = client.backend.describe()
    async with client:  # creates the database / checks the server before starting workers
        previous = await client.status(args.name)
    if previous is not None and not args.json:
        _say(
            f"demo: lock {args.name!r} is held by {previous.owner}; the workers wait for it "
            f"(up to {_fmt_seconds(previous.expires_in)})"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aiodlock-demo-") as marker_dir:
        results = await _run_workers(args, url, namespace, marker_dir, duration)
    total = time.monotonic() - started

    records: list[_Record] = []
    collisions = 0
    errors: list[str] = []
    per_worker: dict[int, int] = {}
    for index, (result, stderr) in enumerate(results):
        if result is None:
            errors.append(f"worker {index} failed: {stderr.strip()[-2000:] or 'no output'}")
            continue
        collisions += int(result["collisions"])
        errors.extend(f"worker {index}: {e}" for e in result["errors"])
        per_worker[index] = len(result["records"])
        records.extend(_Record(index, *row) for row in result["records"])
    report = analyse(records, collisions)
    report.update(
        {
            "workers": args.workers,
            "per_worker": [per_worker.get(i, 0) for i in range(args.workers)],
            "errors": errors,
            "total_time": total,
            "url": shown,
            "namespace": namespace,
            "name": args.name,
        }
    )
    ok = (
        not errors
        and report["overlaps"] == 0
        and report["tokens_increasing"]
        and report["acquisitions"] > 0
    )
    report["ok"] = ok
    if args.json:
        print(json.dumps(report))
    else:
        _print_demo_report(report)
    return EX_OK if ok else EX_FREE


def _print_demo_report(report: dict[str, Any]) -> None:
    per = " ".join(f"w{i}={n}" for i, n in enumerate(report["per_worker"]))
    lines = [
        f"aiodlock demo: {report['workers']} "
        f"{'process' if report['workers'] == 1 else 'processes'}, one lock {report['name']!r} "
        f"(namespace {report['namespace']!r}) on {report['url']}",
        f"acquisitions: {report['acquisitions']} total; per worker: {per}",
        f"overlaps: {report['overlaps']}"
        + (
            f" (marker file collisions: {report['marker_collisions']})"
            if report["marker_collisions"]
            else ""
        ),
        f"tokens strictly increasing in entry order: "
        f"{'yes' if report['tokens_increasing'] else 'NO'}",
        f"wait time: p50 {_ms(report['wait_p50'])}, p99 {_ms(report['wait_p99'])}",
        f"handoff gap: p50 {_ms(report['handoff_p50'])}, p99 {_ms(report['handoff_p99'])} "
        f"({report['handoffs']} hand-offs to a waiting worker)",
        f"total time: {report['total_time']:.2f} s",
    ]
    lines.extend(f"error: {e}" for e in report["errors"])
    lines.append("result: OK" if report["ok"] else "result: FAILED")
    print("\n".join(lines), flush=True)


async def _run_workers(
    args: argparse.Namespace,
    url: str,
    namespace: str,
    marker_dir: str,
    duration: float | None,
) -> list[tuple[dict[str, Any] | None, str]]:
    env = dict(os.environ)
    env["AIODLOCK_URL"] = url  # not on the command line, where `ps` would show a password
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    argv = [
        sys.executable,
        "-m",
        "aiodlock",
        "_demo-worker",
        "--namespace",
        namespace,
        "--name",
        args.name,
        "--marker-dir",
        marker_dir,
        "--rounds",
        str(args.rounds or 0),
        "--hold-ms",
        str(args.hold_ms[0]),
        str(args.hold_ms[1]),
    ]
    procs: list[asyncio.subprocess.Process] = []
    readers: list[asyncio.Future[str]] = []
    stage = "start"
    try:
        for index in range(args.workers):
            procs.append(
                await asyncio.create_subprocess_exec(
                    *argv,
                    "--index",
                    str(index),
                    env=env,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        stderr_reads = [asyncio.ensure_future(_read_all(p.stderr)) for p in procs]
        readers.extend(stderr_reads)
        # Start together: every worker has connected before anyone contends.
        with anyio.fail_after(60):
            for proc, stderr_read in zip(procs, stderr_reads, strict=True):
                assert proc.stdout is not None
                line = await proc.stdout.readline()
                if line.strip() != b"ready":
                    await proc.wait()
                    stderr = (await stderr_read).strip()[-2000:]
                    raise _Exit(EX_UNAVAILABLE, f"demo: a worker failed to start: {stderr}")
        stage = "finish"
        deadline = 0.0 if duration is None else time.monotonic() + duration
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {deadline!r}\n".encode())
            await proc.stdin.drain()
            proc.stdin.close()
        outputs = [asyncio.ensure_future(_read_all(p.stdout)) for p in procs]
        readers.extend(outputs)
        with anyio.fail_after(60.0 + (duration or 0.0)):
            texts = await asyncio.gather(*outputs)
            stderrs = await asyncio.gather(*stderr_reads)
            for proc in procs:
                await proc.wait()
        results: list[tuple[dict[str, Any] | None, str]] = []
        for proc, text, stderr in zip(procs, texts, stderrs, strict=True):
            parsed: dict[str, Any] | None = None
            if proc.returncode == 0:
                with contextlib.suppress(ValueError):
                    parsed = json.loads(text)
            results.append((parsed, stderr))
        return results
    except TimeoutError:
        raise _Exit(
            EX_FREE, f"demo: the workers did not {stage} in time; they were killed"
        ) from None
    finally:
        for reader in readers:
            reader.cancel()
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with anyio.CancelScope(shield=True):
                    await proc.wait()


async def _read_all(stream: asyncio.StreamReader | None) -> str:
    if stream is None:
        return ""
    data = await stream.read()
    return data.decode(errors="replace")


async def _cmd_demo_worker(args: argparse.Namespace) -> int:
    """One demo worker: prints ``ready``, waits for ``go DEADLINE``, loops, prints JSON."""
    low, high = (x / 1000 for x in args.hold_ms)
    marker = os.path.join(args.marker_dir, "inside")
    rng = random.Random()
    records: list[tuple[int, float, float, float]] = []
    collisions = 0
    errors: list[str] = []
    # A fixed lease: a crashed worker frees the lock within seconds, not watchdog_ttl.
    async with _make_client(args) as client:
        lock = client.lock(args.name, ttl=10.0)
        print("ready", flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        parts = line.split()
        if len(parts) != 2 or parts[0] != "go":
            return EX_CONFIG
        deadline = float(parts[1])
        while True:
            if args.rounds and len(records) >= args.rounds:
                break
            if deadline and time.monotonic() >= deadline:
                break
            requested = time.monotonic()
            try:
                lease = await lock.acquire()
            except LockError as exc:
                errors.append(f"acquire: {exc}")
                break
            entered = time.monotonic()
            mine = True
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                collisions += 1  # somebody else is inside
                mine = False
            else:
                os.close(fd)
            await asyncio.sleep(rng.uniform(low, high))
            if mine:
                try:
                    os.remove(marker)
                except FileNotFoundError:
                    collisions += 1  # somebody else came in and left meanwhile
            exited = time.monotonic()
            try:
                await lock.release()
            except LockError as exc:
                errors.append(f"release: {exc}")
            records.append((lease.token, requested, entered, exited))
    print(json.dumps({"records": records, "collisions": collisions, "errors": errors}))
    return EX_OK
