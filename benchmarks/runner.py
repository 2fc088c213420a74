"""``python -m benchmarks``: every workload for every adapter in ONE run against ONE server.

Starts a fresh redis-server on a free loopback port (``tests/servers.py``), runs the
workloads, writes ``benchmarks/results/<name>.json`` and ``<name>.md`` and prints the
ratios and the targets (PASS/FAIL).  ``--quick`` is a smoke run of a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import datetime
import gc
import hashlib
import io
import json
import platform
import pstats
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import workloads
from .adapters import ADAPTERS, DEFAULT_ADAPTERS, Adapter, versions
from .paired import progress_due, rotations
from .report import evaluate, markdown, ratio_lines
from .server import log
from .side import RESULTS_DIR, csv_list, git_state, loadavg, machine
from .stats import summary_ms

__all__ = ["Config", "main", "run_suite"]

WORKLOADS = ["A", "B", "B-fair", "C", "traffic"]


@dataclasses.dataclass
class Config:
    name: str = "full"
    adapters: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_ADAPTERS))
    workloads: list[str] = dataclasses.field(default_factory=lambda: list(WORKLOADS))
    a_seconds: float = 0.02
    a_rounds: int = 150
    b_seconds: float = 3.0
    b_repeats: int = 3
    b_settle: float = 0.5
    b_workers: int = 8
    hold_ms: float = 0.0
    think_ms: float = 0.0
    c_seconds: float = 0.1
    c_rounds: int = 20
    c_tasks: int = 64
    traffic: list[str] = dataclasses.field(default_factory=lambda: ["aiodlock:fair", "aiodlock"])
    traffic_waiters: list[int] = dataclasses.field(default_factory=lambda: [2, 8, 32])
    traffic_releases: int = 300
    traffic_hold_ms: float = 1.0
    drain_timeout: float = 15.0
    profile: str | None = None
    out: Path = RESULTS_DIR
    quick: bool = False

    def apply_quick(self) -> None:
        self.quick = True
        self.a_seconds, self.a_rounds = 0.02, 10
        self.b_seconds, self.b_repeats, self.b_settle = 0.6, 1, 0.2
        self.c_seconds, self.c_rounds = 0.1, 2
        self.traffic_waiters = [2, 4]
        self.traffic_releases = 40


def _source_digest() -> str:
    """A digest of aiodlock's Python sources (they may differ from the git commit)."""
    root = Path(__file__).resolve().parents[1] / "aiodlock"
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


async def _server_info(url: str) -> str:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    return f"redis-server {info.get('redis_version')} on {urlsplit(url).netloc} (loopback)"


class _Suite:
    def __init__(self, cfg: Config, url: str | None, flush: bool) -> None:
        self.cfg = cfg
        self.url = url
        self.flush = flush
        self.run_id = uuid.uuid4().hex[:8]
        self.profiles: list[str] = []

    def key(self, workload: str, adapter: str, extra: str = "") -> str:
        return f"bench:{self.run_id}:{workload}:{adapter}{':' + extra if extra else ''}"

    async def _flush(self) -> None:
        if not (self.flush and self.url):
            return
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.url)
        try:
            await client.flushall()
        finally:
            await client.aclose()

    async def segment(
        self,
        cls: type[Adapter],
        workload: str,
        body: Callable[[Adapter], Awaitable[dict[str, Any]]],
        tag: str = "",
        *,
        tasks: int = 1,
    ) -> dict[str, Any]:
        """Open a fresh adapter, warm it up, run ``body``, close it; errors become a row."""
        await self._flush()
        adapter = cls(self.url)
        started = time.perf_counter()
        profiler: cProfile.Profile | None = None
        try:
            await adapter.open()
            try:
                await workloads.warm_up(adapter, self.key("warmup", cls.name, tag), tasks=tasks)
                gc.collect()
                if self.cfg.profile == cls.name:
                    profiler = cProfile.Profile()
                    profiler.enable()
                result = await body(adapter)
                if profiler is not None:
                    profiler.disable()
                    self._dump_profile(profiler, cls.name, workload, tag)
            finally:
                await adapter.close()
        except Exception as exc:
            log(f"  {workload:<7} {cls.name:<18} ERROR {exc!r}")
            return {"error": repr(exc)}
        took = time.perf_counter() - started
        log(f"  {workload:<7} {cls.name:<18} {_brief(result)} ({took:.1f} s)")
        return result

    async def interleaved(
        self,
        classes: list[type[Adapter]],
        workload: str,
        body: Callable[[Adapter, str], Awaitable[dict[str, Any]]],
        *,
        rounds: int,
        tasks: int,
        slice_seconds: float,
    ) -> dict[str, dict[str, Any]]:
        """Every adapter open at once; ``rounds`` rounds of one short slice per adapter.

        The slices of one round run back to back (the order rotates every round), so a
        change of the machine's load hits the adapters of a round alike; the ratio to the
        floor is taken per round (paired) and the median over rounds is reported.  Client
        CPU (this process) and server CPU (INFO cpu) are counted around every slice.
        """
        await self._flush()
        opened: dict[str, Adapter] = {}
        errors: dict[str, str] = {}
        for cls in classes:
            adapter = cls(self.url)
            try:
                await adapter.open()
                opened[cls.name] = adapter
                await workloads.warm_up(
                    adapter, self.key("warmup", cls.name, workload), tasks=tasks
                )
            except Exception as exc:
                errors[cls.name] = repr(exc)
                log(f"  {workload:<7} {cls.name:<18} ERROR {exc!r}")
        profiler = cProfile.Profile() if self.cfg.profile in opened else None
        slices: dict[str, list[dict[str, Any]]] = {name: [] for name in opened}
        latencies: dict[str, list[float]] = {name: [] for name in opened}
        monitor = await self._monitor()
        order = [c for c in classes if c.name in opened]
        try:
            for turn, classes_now in rotations(order, rounds):
                for cls in classes_now:
                    if cls.name in errors:
                        continue
                    key = self.key(workload, cls.name, str(turn))
                    profiled = profiler is not None and cls.name == self.cfg.profile
                    try:
                        server0 = await _server_cpu(monitor)
                        cpu0 = time.process_time()
                        if profiled:
                            profiler.enable()  # type: ignore[union-attr]
                        try:
                            result = await body(opened[cls.name], key)
                        finally:
                            if profiled:
                                profiler.disable()  # type: ignore[union-attr]
                        cpu1 = time.process_time()
                        server1 = await _server_cpu(monitor)
                    except Exception as exc:
                        errors[cls.name] = repr(exc)
                        log(f"  {workload:<7} {cls.name:<18} ERROR {exc!r}")
                        continue
                    latencies[cls.name].extend(result.pop("_latencies"))
                    slices[cls.name].append(
                        {
                            "round": turn,
                            "cycles": result["cycles"],
                            "seconds": result["seconds"],
                            "client_cpu": cpu1 - cpu0,
                            "server_cpu": None if server0 is None else server1 - server0,  # type: ignore[operator]
                            "extra": {k: v for k, v in result.items() if k.startswith("per_")},
                        }
                    )
                if progress_due(turn, rounds):
                    line = ", ".join(
                        f"{c.name} {_rate(slices[c.name]):.0f}"
                        for c in order
                        if c.name not in errors and slices[c.name]
                    )
                    log(f"  {workload:<7} after {turn + 1}/{rounds} rounds, cycles/s: {line}")
        finally:
            if monitor is not None:
                await monitor.aclose()
            for adapter in opened.values():
                try:
                    await adapter.close()
                except Exception as exc:
                    log(f"  closing {adapter.name} failed: {exc!r}")
        if profiler is not None and self.cfg.profile:
            self._dump_profile(profiler, self.cfg.profile, workload, "")
        out: dict[str, dict[str, Any]] = {}
        floor = {r["round"]: _rate([r]) for r in slices.get("floor", [])}
        floor_cpu = _cpu_per_cycle(slices.get("floor", []))
        for cls in classes:
            if cls.name in errors:
                out[cls.name] = {"error": errors[cls.name]}
                continue
            rows = slices[cls.name]
            per_slice = [_rate([r]) for r in rows]
            paired = [_rate([r]) / floor[r["round"]] for r in rows if floor.get(r["round"])]
            client, server = _cpu_per_cycle(rows)
            mine_total = client + (server or 0.0)
            floor_total = floor_cpu[0] + (floor_cpu[1] or 0.0) if floor else 0.0
            out[cls.name] = {
                "cycles": sum(r["cycles"] for r in rows),
                "seconds": round(sum(r["seconds"] for r in rows), 3),
                "slices": len(rows),
                "slice_seconds": slice_seconds,
                "cycles_per_s": round(_rate(rows), 1),
                "median_cycles_per_s": round(statistics.median(per_slice), 1),
                "ratio_to_floor": round(statistics.median(paired), 3) if paired else None,
                "ratio_to_floor_quartiles": _quartiles(paired),
                "cycle": summary_ms(latencies[cls.name]),
                "client_cpu_us_per_cycle": round(client, 1),
                "server_cpu_us_per_cycle": None if server is None else round(server, 1),
                "cpu_ratio_to_floor": round(floor_total / mine_total, 3)
                if floor_total and mine_total
                else None,
                "per_task_min": min((r["extra"].get("per_task_min", 0) for r in rows), default=0)
                if tasks > 1
                else None,
                "tasks": tasks,
                "cycles_per_s_by_slice": [round(x, 1) for x in per_slice],
            }
        return out

    async def _monitor(self) -> Any:
        if not self.url:
            return None
        import redis.asyncio as aioredis

        return aioredis.Redis.from_url(self.url)

    def _dump_profile(
        self, profiler: cProfile.Profile, adapter: str, workload: str, tag: str
    ) -> None:
        self.cfg.out.mkdir(parents=True, exist_ok=True)
        stem = f"{self.cfg.name}-{adapter}-{workload}{'-' + tag if tag else ''}"
        path = self.cfg.out / f"{stem}.prof"
        profiler.dump_stats(path)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        (self.cfg.out / f"{stem}.txt").write_text(text.getvalue())
        self.profiles.append(str(path))


async def _server_cpu(monitor: Any) -> float | None:
    """redis-server's CPU seconds (user + system) so far."""
    if monitor is None:
        return None
    info = await monitor.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _rate(rows: list[dict[str, Any]]) -> float:
    seconds = sum(r["seconds"] for r in rows)
    return sum(r["cycles"] for r in rows) / seconds if seconds else 0.0


def _cpu_per_cycle(rows: list[dict[str, Any]]) -> tuple[float, float | None]:
    """(client, server) CPU microseconds per cycle over all slices."""
    cycles = sum(r["cycles"] for r in rows)
    if not cycles:
        return 0.0, None
    client = sum(r["client_cpu"] for r in rows) * 1e6 / cycles
    servers = [r["server_cpu"] for r in rows]
    if any(s is None for s in servers):
        return client, None
    return client, sum(servers) * 1e6 / cycles


def _quartiles(values: list[float]) -> list[float] | None:
    if len(values) < 4:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4)
    return [round(q1, 3), round(q3, 3)]


def _brief(result: dict[str, Any]) -> str:
    if "cycles_per_s" in result:
        return f"{result['cycles_per_s']:.0f} cycles/s"
    if "wait" in result:
        gap = result["handoff_gap"]
        return (
            f"{result['acquisitions_per_s']:.0f} acq/s, wait p99 {result['wait']['p99_ms']} ms, "
            f"gap p50/p99 {gap['p50_ms']}/{gap['p99_ms']} ms, back-to-self "
            f"{result['same_owner_share']}, per worker {result['per_worker_min']}-"
            f"{result['per_worker_max']}, violations {result['violations']}"
        )
    return ""


def _combine_contention(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeats of one contention run -> one row: medians of the statistics, sums of the
    counts, the worst case of fairness and exclusion; each repeat is kept under ``runs``."""
    good = [r for r in rows if "wait" in r]
    if not good:
        return rows[0] if rows else {"error": "no runs"}
    if len(good) == 1:
        return {**good[0], "repeats": 1, "runs": good, "errors": good[0]["errors"]}

    def median(values: list[Any]) -> Any:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 4) if present else None

    def span(values: list[Any]) -> list[Any] | None:
        present = [v for v in values if v is not None]
        return [min(present), max(present)] if present else None

    out = dict(good[0])
    for key in ("acquisitions_per_s", "same_owner_share"):
        out[key] = median([r[key] for r in good])
    for key in ("acquisitions", "owner_changes", "handoffs", "violations",
                "overlapping_intervals", "censored_waits"):  # fmt: skip
        out[key] = sum(r[key] for r in good)
    for group in ("wait", "handoff_gap"):
        out[group] = {k: median([r[group][k] for r in good]) for k in good[0][group]}
        out[group]["max_ms"] = max((r[group]["max_ms"] or 0.0) for r in good)
        out[group]["n"] = sum(r[group]["n"] for r in good)
    # Fairness: the most uneven repeat (repeats differ in length, so their counts do not mix).
    worst = max(good, key=lambda r: r["max_deviation_from_mean"] or 0.0)
    out["per_worker_min"] = worst["per_worker_min"]
    out["per_worker_max"] = worst["per_worker_max"]
    deviations = [r["max_deviation_from_mean"] for r in good]
    out["max_deviation_from_mean"] = None if any(d is None for d in deviations) else max(deviations)
    out["settle_wait_max_ms"] = max((r.get("settle_wait_max_ms") or 0.0) for r in good)
    out["aborted"] = any(r["aborted"] for r in good)
    out["errors"] = [e for r in rows for e in r.get("errors", [repr(r.get("error"))])]
    out["per_worker"] = None
    out["repeats"] = len(good)
    out["range"] = {
        "wait_p99_ms": span([r["wait"]["p99_ms"] for r in good]),
        "wait_p99_time_weighted_ms": span([r["wait"]["p99_time_weighted_ms"] for r in good]),
        "gap_p50_ms": span([r["handoff_gap"]["p50_ms"] for r in good]),
        "gap_p99_ms": span([r["handoff_gap"]["p99_ms"] for r in good]),
        "same_owner_share": span([r["same_owner_share"] for r in good]),
    }
    out["runs"] = rows
    return out


async def run_suite(cfg: Config, url: str | None, *, flush: bool = False) -> dict[str, Any]:
    """Run the configured workloads; ``url`` is a Redis URL (None: only memory)."""
    suite = _Suite(cfg, url, flush)
    results: dict[str, Any] = {
        "meta": {
            "name": cfg.name,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": " ".join(["python -m benchmarks", *map(shlex.quote, sys.argv[1:])])
            if sys.argv and sys.argv[0].endswith(("benchmarks", "__main__.py"))
            else "(run_suite from Python)",
            "machine": machine(),
            "loadavg_before": loadavg(),
            "server": await _server_info(url) if url else "none",
            "versions": {"python": platform.python_version(), **versions(cfg.adapters)},
            "git": git_state(),
            "aiodlock_sources": _source_digest(),
            "quick": cfg.quick,
            "profiled": cfg.profile,
        },
        "config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()
        },
        "adapters_run": [],
        "roles": {},
        "skipped": {},
    }
    available: list[type[Adapter]] = []
    for name in cfg.adapters:
        cls = ADAPTERS[name]
        reason = "needs a Redis server" if cls.needs_redis and not url else cls.unavailable(url)
        if reason:
            results["skipped"][name] = reason
            log(f"skipping {name}: {reason}")
            continue
        available.append(cls)
        results["adapters_run"].append(name)
        results["roles"][name] = cls.role
    started = time.perf_counter()

    if "A" in cfg.workloads:
        log(f"A: one task, one name, {cfg.a_rounds} rounds x {cfg.a_seconds} s per adapter")

        async def body_a(adapter: Adapter, key: str) -> dict[str, Any]:
            return await workloads.single(adapter, key, seconds=cfg.a_seconds, keep_latencies=True)

        results["A"] = await suite.interleaved(
            available, "A", body_a, rounds=cfg.a_rounds, tasks=1, slice_seconds=cfg.a_seconds
        )

    for workload, fair in (("B", False), ("B-fair", True)):
        if workload not in cfg.workloads:
            continue
        chosen = [c for c in available if c.can_wait and (c.supports_fair or not fair)]
        log(
            f"{workload}: {cfg.b_workers} tasks on one name, {cfg.b_repeats} x "
            f"({cfg.b_settle} s settling + {cfg.b_seconds} s) per adapter"
        )
        repeats: dict[str, list[dict[str, Any]]] = {c.name: [] for c in chosen}
        for turn in range(cfg.b_repeats):
            k = turn % max(len(chosen), 1)
            for cls in chosen[k:] + chosen[:k]:
                key = suite.key(workload, cls.name, str(turn))

                async def body_b(
                    adapter: Adapter, key: str = key, fair: bool = fair
                ) -> dict[str, Any]:
                    return await workloads.contention(
                        adapter,
                        key,
                        workers=cfg.b_workers,
                        seconds=cfg.b_seconds,
                        hold=cfg.hold_ms / 1000,
                        think=cfg.think_ms / 1000,
                        fair=fair,
                        drain_timeout=cfg.drain_timeout,
                        settle=cfg.b_settle,
                    )

                repeats[cls.name].append(
                    await suite.segment(cls, workload, body_b, str(turn), tasks=cfg.b_workers)
                )
        results[workload] = {name: _combine_contention(rows) for name, rows in repeats.items()}

    if "C" in cfg.workloads:
        log(f"C: {cfg.c_tasks} tasks on as many names, {cfg.c_rounds} rounds x {cfg.c_seconds} s")

        async def body_c(adapter: Adapter, key: str) -> dict[str, Any]:
            return await workloads.many_names(
                adapter, key, tasks=cfg.c_tasks, seconds=cfg.c_seconds, keep_latencies=True
            )

        results["C"] = await suite.interleaved(
            available,
            "C",
            body_c,
            rounds=cfg.c_rounds,
            tasks=cfg.c_tasks,
            slice_seconds=cfg.c_seconds,
        )

    if "traffic" in cfg.workloads and url:
        results["traffic"] = {}
        for spec in cfg.traffic:
            name, _, mode = spec.partition(":")
            cls = ADAPTERS.get(name)
            fair = mode == "fair"
            if cls is None or name not in results["adapters_run"] or not cls.needs_redis:
                continue
            if fair and not cls.supports_fair:
                continue
            log(f"traffic: {spec}, waiting clients {cfg.traffic_waiters}")
            series = []
            for n in cfg.traffic_waiters:
                await suite._flush()
                adapter_cls: type[Adapter] = cls
                try:
                    row = await workloads.wake_traffic(
                        lambda adapter_cls=adapter_cls: adapter_cls(url),
                        suite.key("traffic", spec.replace(":", "-"), str(n)),
                        monitor_url=url,
                        waiters=n,
                        releases=cfg.traffic_releases,
                        hold=cfg.traffic_hold_ms / 1000,
                        fair=fair,
                    )
                    log(
                        f"  traffic {spec:<14} N={n:<3} {row['commands_per_release']:.2f} cmds, "
                        f"{row['publish_per_release']:.2f} publish, "
                        f"{row['out_bytes_per_release']:.0f} B out per release"
                    )
                except Exception as exc:
                    log(f"  traffic {spec} N={n} ERROR {exc!r}")
                    row = {"waiters": n, "error": repr(exc)}
                series.append(row)
            results["traffic"][spec] = series

    results["meta"]["loadavg_after"] = loadavg()
    results["meta"]["wall_seconds"] = round(time.perf_counter() - started, 1)
    results["profiles"] = suite.profiles
    results["targets"] = evaluate(results)
    return results


def write(results: dict[str, Any], out: Path, name: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{name}.json"
    md_path = out / f"{name}.md"
    json_path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    md_path.write_text(markdown(results, results["targets"]))
    return json_path, md_path


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    cfg = Config()
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark aiodlock against the Redis floor and peer libraries.",
    )
    p.add_argument("--name", help="results file stem (default: full, or quick with --quick)")
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    p.add_argument(
        "--adapters",
        type=csv_list,
        default=None,
        help=f"comma-separated, from {', '.join(ADAPTERS)} (default: all but memory)",
    )
    p.add_argument(
        "--workloads",
        type=csv_list,
        default=None,
        help=f"comma-separated, from {', '.join(WORKLOADS)}",
    )
    p.add_argument(
        "--url",
        help="use this Redis instead of starting a fresh one (never the system Redis on 6379; "
        "its keys are not flushed)",
    )
    p.add_argument("--a-seconds", type=float)
    p.add_argument("--a-rounds", type=int)
    p.add_argument("--b-seconds", type=float)
    p.add_argument("--b-repeats", type=int, help="B runs per adapter (medians are reported)")
    p.add_argument("--b-settle", type=float, help="B: seconds before the measured window")
    p.add_argument("--b-workers", type=int)
    p.add_argument("--hold-ms", type=float, help="time inside the lock in B (0: one yield)")
    p.add_argument("--think-ms", type=float, help="pause between release and next acquire in B")
    p.add_argument("--c-seconds", type=float)
    p.add_argument("--c-rounds", type=int)
    p.add_argument("--c-tasks", type=int)
    p.add_argument("--traffic", type=csv_list, help="adapter[:fair] specs for the traffic workload")
    p.add_argument("--traffic-waiters", type=lambda s: [int(x) for x in csv_list(s)])
    p.add_argument("--traffic-releases", type=int)
    p.add_argument("--traffic-hold-ms", type=float)
    p.add_argument("--drain-timeout", type=float)
    p.add_argument("--profile", metavar="ADAPTER", help="cProfile this adapter's workloads")
    p.add_argument("--out", type=Path, help=f"results directory (default {RESULTS_DIR})")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when a target FAILs or a run errors"
    )
    args = p.parse_args(argv)
    if args.quick:
        cfg.apply_quick()
    for field in dataclasses.fields(Config):
        value = getattr(args, field.name, None)
        if value is not None and field.name not in ("quick", "name"):
            setattr(cfg, field.name, value)
    cfg.name = args.name or ("quick" if args.quick else "full")
    unknown = [a for a in cfg.adapters if a not in ADAPTERS]
    if unknown:
        p.error(f"unknown adapter(s) {', '.join(unknown)}; known: {', '.join(ADAPTERS)}")
    bad = [w for w in cfg.workloads if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workload(s) {', '.join(bad)}; known: {', '.join(WORKLOADS)}")
    if args.url and (urlsplit(args.url).port or 6379) == 6379:
        p.error("refusing to benchmark against port 6379 (the system Redis); omit --url")
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    needs_server = any(ADAPTERS[a].needs_redis for a in cfg.adapters)
    if args.url or not needs_server:
        results = asyncio.run(run_suite(cfg, args.url, flush=False))
    else:
        from .server import redis_server

        with redis_server() as server:
            log(f"redis-server {server.address} (pid {server.pid}), fresh, no persistence")
            results = asyncio.run(run_suite(cfg, server.url, flush=True))
    json_path, md_path = write(results, cfg.out, cfg.name)
    print(markdown(results, results["targets"]))
    print("Ratios:")
    for line in ratio_lines(results):
        print(f"  {line}")
    print("Targets:")
    for t in results["targets"]:
        note = f" ({t['note']})" if t["note"] else ""
        print(f"  [{t['status']}] {t['goal']}: {t['measured']}{note}")
    print(f"wrote {json_path} and {md_path} ({results['meta']['wall_seconds']} s of workloads)")
    if args.strict:
        failed = any(t["status"] == "FAIL" for t in results["targets"])
        errored = any(
            "error" in row or row.get("errors") or row.get("aborted")
            for workload in ("A", "B", "B-fair", "C")
            for row in results.get(workload, {}).values()
        )
        return 1 if failed or errored else 0
    return 0
