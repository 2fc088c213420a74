"""SQLite benchmarks: aiodlock's ``sqlite://`` (the embedded default) against filelock and
the raw floor, on a file in a temporary directory.

* ``floor``: the fewest statements a table lock needs, ``INSERT`` of the name's row and
  ``DELETE`` by owner, on one stdlib :mod:`sqlite3` connection in autocommit (WAL), called
  on the event loop itself (no thread hop): it cannot wait, so it sits out B;
* ``filelock``: ``filelock.AsyncFileLock(path)`` per worker (``flock`` on a lock file, the
  single-host lock people pick instead), polling every ``poll_interval`` (0.05 s default);
* ``aiodlock``: ``aiodlock.connect("sqlite:///...")``, public API, default options.

A: one task, one name, interleaved slices (rotating order, median per-round ratio); B: 8
tasks of one client contend for one name (:func:`benchmarks.workloads.contention`).

    python -m benchmarks.sqlite [--quick]

Writes ``benchmarks/results/<name>.json`` and ``.md`` (name: ``sqlite`` by default).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import workloads
from .adapters import Adapter, AiodlockAdapter
from .paired import rotations
from .server import log
from .side import SideBenchmark, loadavg, save_run, side_report_head, side_rows

__all__ = ["ADAPTERS", "main"]

perf = time.perf_counter


def _path(url: str | None) -> Path:
    assert url is not None
    assert url.startswith("sqlite:///")
    return Path(url.removeprefix("sqlite://"))


class AiodlockSQLite(AiodlockAdapter):
    name = "aiodlock"
    library = "aiodlock (sqlite://)"
    packages = ("aiodlock",)
    needs_redis = False

    async def abort(self, name: str) -> None:
        await self.client.force_release(name)


class SQLiteFloor(Adapter):
    """INSERT + DELETE by owner on one autocommit sqlite3 connection, on the loop."""

    name = "floor"
    library = "sqlite3 INSERT + DELETE (autocommit, WAL)"
    role = "floor"
    needs_redis = False
    can_wait = False

    async def open(self) -> None:
        self.db = sqlite3.connect(_path(self.url).with_name("floor.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, owner TEXT)")

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return (name, uuid.uuid4().hex)

    async def acquire(self, lock: Any) -> float | None:
        self.db.execute("INSERT INTO locks VALUES (?, ?)", lock)
        return None

    async def release(self, lock: Any) -> None:
        self.db.execute("DELETE FROM locks WHERE name = ? AND owner = ?", lock)

    async def close(self) -> None:
        self.db.close()

    async def abort(self, name: str) -> None:
        self.db.execute("DELETE FROM locks WHERE name = ?", (name,))


class FileLockPeer(Adapter):
    """``filelock.AsyncFileLock`` on one lock file per name (``flock``; polls when busy)."""

    name = "filelock"
    library = "filelock AsyncFileLock (flock, polls every 0.05 s)"
    role = "peer"
    packages = ("filelock",)
    needs_redis = False

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        try:
            import filelock  # noqa: F401
        except ImportError as exc:
            return f"filelock is not installed ({exc}); pip install 'aiodlock[bench]'"
        return None

    async def open(self) -> None:
        self.dir = _path(self.url).parent

    def new_lock(self, name: str, fair: bool = False) -> Any:
        from filelock import AsyncFileLock

        return AsyncFileLock(self.dir / f"{name.replace(':', '_')}.lock")

    async def acquire(self, lock: Any) -> float | None:
        await lock.acquire()
        return None

    async def release(self, lock: Any) -> None:
        await lock.release()

    async def abort(self, name: str) -> None:
        return None


ADAPTERS: dict[str, type[Adapter]] = {
    cls.name: cls for cls in (AiodlockSQLite, FileLockPeer, SQLiteFloor)
}


async def _interleaved_a(
    classes: list[type[Adapter]], url: str, run_id: str, *, rounds: int, seconds: float
) -> dict[str, Any]:
    """Every adapter open at once; per round one slice each, in a rotating order."""
    opened = {}
    for cls in classes:
        adapter = cls(url)
        await adapter.open()
        await workloads.warm_up(adapter, f"{run_id}-warmA-{cls.name}")
        opened[cls.name] = adapter
    rates: dict[str, list[float]] = {name: [] for name in opened}
    ratios: list[float] = []
    names = list(opened)
    try:
        for _, order in rotations(names, rounds):
            this_round: dict[str, float] = {}
            for name in order:
                row = await workloads.single(opened[name], f"{run_id}-A-{name}", seconds=seconds)
                this_round[name] = row["cycles_per_s"]
                rates[name].append(row["cycles_per_s"])
            if this_round.get("floor") and "aiodlock" in this_round:
                ratios.append(this_round["aiodlock"] / this_round["floor"])
    finally:
        for adapter in opened.values():
            await adapter.close()
    out: dict[str, Any] = {
        name: {
            "cycles_per_s": round(statistics.median(values), 1),
            "cycles_per_s_by_slice": [round(v, 1) for v in values],
        }
        for name, values in rates.items()
    }
    out["ratio_to_floor"] = round(statistics.median(ratios), 3) if ratios else None
    return out


def _brief_b(result: dict[str, Any]) -> str:
    gap = result["handoff_gap"]
    return f"{result['acquisitions_per_s']:.0f} acq/s, gap p50/p99 {gap['p50_ms']}/{gap['p99_ms']}"


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    classes, skipped = [], {}
    for name in args.adapters:
        reason = ADAPTERS[name].unavailable(url)
        if reason:
            skipped[name] = reason
            log(f"skipping {name}: {reason}")
        else:
            classes.append(ADAPTERS[name])
    started = perf()
    log(f"A: one task, one name, {args.a_rounds} rounds x {args.a_seconds} s per adapter")
    a = await _interleaved_a(classes, url, run_id, rounds=args.a_rounds, seconds=args.a_seconds)
    results: dict[str, Any] = {"skipped": skipped, "A": a, "B": {}}
    log(f"B: {args.b_workers} tasks on one name, {args.b_seconds} s per adapter")
    for cls in (c for c in classes if c.can_wait):

        async def body_b(adapter: Adapter) -> dict[str, Any]:
            return await workloads.contention(
                adapter,
                f"{run_id}-B-{adapter.name}",
                workers=args.b_workers,
                seconds=args.b_seconds,
                settle=args.b_settle,
            )

        results["B"][cls.name] = await workloads.segment(
            cls, url, body_b, f"{run_id}-warmB-{cls.name}", label=f"B {cls.name}", brief=_brief_b
        )
    results["wall_seconds"] = round(perf() - started, 1)
    return results


def markdown(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [
        *side_report_head("SQLite", "database", doc["meta"]),
        "| adapter | A: cycles/s | B: acq/s | B: gap p50 ms | B: gap p99 ms | B: violations |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, a, b in side_rows(res, ADAPTERS):
        gap = b.get("handoff_gap", {})
        lines.append(
            f"| {name} | {a.get('cycles_per_s', '')} | {b.get('acquisitions_per_s', '')} "
            f"| {gap.get('p50_ms', '')} | {gap.get('p99_ms', '')} | {b.get('violations', '')} |"
        )
    lines += ["", f"A: aiodlock / floor, median of paired rounds: {res['A']['ratio_to_floor']}"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    cli = SideBenchmark(
        "sqlite",
        __doc__,
        ADAPTERS,
        {"a_seconds": 0.2, "a_rounds": 15, "b_seconds": 3.0, "b_settle": 0.5},
        {"a_seconds": 0.1, "a_rounds": 3, "b_seconds": 0.5, "b_settle": 0.1},
    )
    return cli.parse(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="aiodlock-bench-sqlite-")
    try:
        loadavg_before = loadavg()
        results = asyncio.run(run(args, f"sqlite:///{tmp}/locks.db"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = save_run(
        out=args.out,
        name=args.name,
        module="benchmarks.sqlite",
        argv=argv,
        server=f"a SQLite {sqlite3.sqlite_version} file in a temporary directory",
        packages=("aiodlock", "filelock"),
        loadavg_before=loadavg_before,
        results=results,
        targets=lambda r: [],
        markdown=markdown,
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
