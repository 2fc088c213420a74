"""Redlock benchmarks: aiodlock's ``redlock://`` against pottery and aioredlock on 5 masters.

Five fresh redis-servers on free loopback ports (``tests/servers.py``, no persistence), the
runner's adapter interface (:class:`benchmarks.adapters.Adapter`) and workloads:

* A: one task, one name, acquire+release cycles.  Every adapter is open at once and the
  run is cut into short slices, one per adapter per round, in a rotating order, so that a
  change of the (shared, loaded) machine's speed hits every adapter of a round alike; the
  ratios are taken per round and their median is reported.
* B: 8 tasks of one client contend for one name (:func:`benchmarks.workloads.contention`).

Adapters:

* ``aiodlock``: ``aiodlock.connect("redlock://h1,...,h5")``, public API, default options;
* ``aiodlock-sequential``: the same backend with its fan-out replaced by a loop that asks
  the nodes one after the other (:class:`SequentialRedlock`, defined here for the benchmark
  only): what the concurrent fan-out gains;
* ``pottery``: ``pottery.AIORedlock(key=name, masters={5 clients})``, defaults;
* ``aioredlock``: ``aioredlock.Aioredlock([5 x {host, port}]).lock(name)``, defaults, called
  again after each ``LockError`` (it has no "wait forever").

    python -m benchmarks.redlock              # everything (~2 minutes)
    python -m benchmarks.redlock --quick      # a smoke run (numbers are noise)

Writes ``benchmarks/results/<name>.json`` and ``.md`` (name: ``redlock`` by default) and
prints the targets of issue 4 (PASS/FAIL).  The numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

from . import adapters, workloads
from .adapters import Adapter, AiodlockAdapter
from .paired import progress_due, rotations
from .server import log, redis_masters
from .side import SideBenchmark, loadavg, save_run, side_report_head, side_rows, target_lines

__all__ = ["ADAPTERS", "SequentialRedlock", "main"]

perf = time.perf_counter
NODES = 5


def _hosts(url: str | None) -> list[tuple[str, int]]:
    assert url is not None
    out = []
    for part in url.split("://", 1)[1].split("/", 1)[0].split(","):
        host, _, port = part.rpartition(":")
        out.append((host, int(port)))
    return out


def _sequential_backend_class() -> type[Any]:
    from aiodlock.backends.redis import RedlockBackend
    from aiodlock.backends.redis._quorum import NO_ANSWER, Gather, Quorum

    class SequentialQuorum(Quorum):
        """The fan-out asking the nodes one after the other (benchmark only).

        The same requests on the same connections; the next node is asked when the
        previous one answered (or its time ran out), and every node is asked (the classic
        Redlock loop).
        """

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self._deferred: dict[int, tuple[Sequence[Any], Any]] = {}

        def start(self, nodes: Sequence[Any], request: Any, gather: Any) -> None:
            self._deferred[id(gather)] = (nodes, request)  # sent by the waiting half

        async def finish(
            self, gather: Any, *, timeout: float, patience: float | None = None
        ) -> None:
            nodes, request = self._deferred.pop(id(gather))
            for index, node in enumerate(nodes):
                one = Gather(1)
                super().start([node], request, one)
                await super().finish(one, timeout=timeout)
                if one.replies[0] is not NO_ANSWER:
                    gather.deliver(index, one.replies[0])

    class SequentialRedlockBackend(RedlockBackend):
        """aiodlock's Redlock asking the nodes one after the other (benchmark only)."""

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.fan = SequentialQuorum(self.quorum, self.secrets)

    return SequentialRedlockBackend


class AiodlockRedlock(AiodlockAdapter):
    """aiodlock through its public API on ``redlock://`` (5 masters)."""

    name = "aiodlock"
    library = "aiodlock (redlock://, 5 masters, concurrent fan-out)"
    packages = ("aiodlock", "redis", "hiredis")


class SequentialRedlock(AiodlockRedlock):
    """The same, asking the nodes one after the other (a subclass defined for this benchmark)."""

    name = "aiodlock-sequential"
    library = "aiodlock redlock with a sequential node-by-node fan-out (benchmark subclass)"
    role = "floor-variant"

    def _client(self) -> Any:
        import aiodlock

        plain = super()._client()
        backend = plain.backend
        return aiodlock.Client(_sequential_backend_class()(backend.settings, backend.config))


class _FiveMasters(Adapter):
    """Peers on every master of the URL; ``abort`` deletes the name's keys on each."""

    def master_hosts(self) -> list[tuple[str, int]]:
        return _hosts(self.url)

    async def abort(self, name: str) -> None:
        import redis.asyncio as aioredis

        for host, port in _hosts(self.url):
            client = aioredis.Redis(host=host, port=port)
            try:
                async for key in client.scan_iter(match=f"*{name}*"):
                    await client.delete(key)
            finally:
                await client.aclose()


class PotteryRedlock(_FiveMasters, adapters.PotteryRedlock):
    """pottery ``AIORedlock`` on the 5 masters: 10 s auto-release, retries after 0-0.2 s."""

    library = "pottery AIORedlock (5 masters, defaults)"


class AioredlockRedlock(_FiveMasters, adapters.Aioredlock):
    """aioredlock on the 5 masters: 3 tries 0.1-0.3 s apart, then ``LockError`` (retried)."""

    library = "aioredlock (5 masters, defaults, retried on LockError)"


ADAPTERS: dict[str, type[Adapter]] = {
    cls.name: cls for cls in (AiodlockRedlock, SequentialRedlock, PotteryRedlock, AioredlockRedlock)
}

PEERS = ("pottery", "aioredlock")


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


async def _interleaved_a(
    classes: list[type[Adapter]], url: str, run_id: str, *, rounds: int, slice_seconds: float
) -> dict[str, Any]:
    opened: dict[str, Adapter] = {}
    errors: dict[str, str] = {}
    for cls in classes:
        adapter = cls(url)
        try:
            await adapter.open()
            await workloads.warm_up(adapter, f"{run_id}-warmA-{cls.name}")
            opened[cls.name] = adapter
        except Exception as exc:
            errors[cls.name] = repr(exc)
            log(f"  A   {cls.name:<20} ERROR {exc!r}")
    order = [c.name for c in classes if c.name in opened]
    slices: dict[str, list[dict[str, float]]] = {name: [] for name in order}
    latencies: dict[str, list[float]] = {name: [] for name in order}
    try:
        for turn, names in rotations(order, rounds):
            for name in names:
                if name in errors:
                    continue
                cpu0 = time.process_time()
                try:
                    result = await workloads.single(
                        opened[name],
                        f"{run_id}-A-{name}-{turn}",
                        seconds=slice_seconds,
                        keep_latencies=True,
                    )
                except Exception as exc:
                    errors[name] = repr(exc)
                    log(f"  A   {name:<20} ERROR {exc!r}")
                    continue
                cpu = time.process_time() - cpu0
                latencies[name].extend(result.pop("_latencies"))
                slices[name].append(
                    {
                        "round": turn,
                        "cycles": result["cycles"],
                        "seconds": result["seconds"],
                        "cpu": cpu,
                    }
                )
            if progress_due(turn, rounds):
                line = ", ".join(
                    f"{n} {_rate(slices[n]):.0f}" for n in order if n not in errors and slices[n]
                )
                log(f"  A   after {turn + 1}/{rounds} rounds, cycles/s: {line}")
    finally:
        for adapter in opened.values():
            with contextlib.suppress(Exception):
                await adapter.close()
    from .stats import summary_ms

    out: dict[str, Any] = {}
    for cls in classes:
        name = cls.name
        if name in errors:
            out[name] = {"error": errors[name]}
            continue
        rows = slices[name]
        cycles = sum(r["cycles"] for r in rows)
        out[name] = {
            "cycles": cycles,
            "seconds": round(sum(r["seconds"] for r in rows), 3),
            "slices": len(rows),
            "cycles_per_s": round(_rate(rows), 1),
            "median_cycles_per_s": round(statistics.median(_rate([r]) for r in rows), 1),
            "client_cpu_us_per_cycle": round(sum(r["cpu"] for r in rows) / cycles * 1e6, 1)
            if cycles
            else None,
            "cycle": summary_ms(latencies[name]),
            "_by_round": {int(r["round"]): _rate([r]) for r in rows},
        }
    return out


def _rate(rows: Sequence[dict[str, float]]) -> float:
    seconds = sum(r["seconds"] for r in rows)
    return sum(r["cycles"] for r in rows) / seconds if seconds else 0.0


def _paired(a: dict[str, Any], mine: str, others: Sequence[str]) -> float | None:
    """Median over rounds of (mine / the best of ``others`` in that round)."""
    ours = a.get(mine, {}).get("_by_round")
    if not ours:
        return None
    ratios = []
    for turn, rate in ours.items():
        theirs = [a[o]["_by_round"].get(turn) for o in others if "_by_round" in a.get(o, {})]
        best = max((t for t in theirs if t), default=None)
        if best:
            ratios.append(rate / best)
    return round(statistics.median(ratios), 3) if ratios else None


def _brief_b(result: dict[str, Any]) -> str:
    gap = result["handoff_gap"]
    return (
        f"{result['acquisitions_per_s']:.0f} acq/s, gap p50/p99 {gap['p50_ms']}/{gap['p99_ms']} "
        f"ms, wait p99 {result['wait']['p99_ms']} ms, same owner {result['same_owner_share']}, "
        f"violations {result['violations']}"
    )


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    available = []
    skipped = {}
    for name in args.adapters:
        cls = ADAPTERS[name]
        reason = cls.unavailable(url)
        if reason:
            skipped[name] = reason
            log(f"skipping {name}: {reason}")
        else:
            available.append(cls)
    results: dict[str, Any] = {"skipped": skipped, "A": {}, "B": {}}
    started = perf()
    log(f"A: one task, one name, {args.a_rounds} rounds x {args.a_seconds} s per adapter")
    a = await _interleaved_a(
        available, url, run_id, rounds=args.a_rounds, slice_seconds=args.a_seconds
    )
    results["A_ratios"] = {
        "aiodlock_vs_best_peer": _paired(a, "aiodlock", PEERS),
        "aiodlock_vs_sequential": _paired(a, "aiodlock", ("aiodlock-sequential",)),
    }
    for row in a.values():
        row.pop("_by_round", None)
    results["A"] = a
    log(f"B: {args.b_workers} tasks on one name, {args.b_seconds} s per adapter")
    for cls in available:

        async def body_b(adapter: Adapter) -> dict[str, Any]:
            return await workloads.contention(
                adapter,
                f"{run_id}-B-{adapter.name}",
                workers=args.b_workers,
                seconds=args.b_seconds,
                hold=args.hold_ms / 1000,
                settle=args.b_settle,
            )

        results["B"][cls.name] = await workloads.segment(
            cls,
            url,
            body_b,
            f"{run_id}-warmB-{cls.name}",
            label=f"B   {cls.name:<20}",
            brief=_brief_b,
        )
    results["wall_seconds"] = round(perf() - started, 1)
    return results


def targets(results: dict[str, Any]) -> list[dict[str, str]]:
    """The targets of issue 4.  A ratios are judged as the runner judges A: the median over
    rounds of the ratio of the slices of the same round (paired); the overall ratio of the
    totals is shown next to it."""
    out: list[dict[str, str]] = []
    a = results["A"]
    ratios = results.get("A_ratios", {})
    ours = a.get("aiodlock", {}).get("cycles_per_s")
    peers = {p: a[p]["cycles_per_s"] for p in PEERS if "cycles_per_s" in a.get(p, {})}
    paired = ratios.get("aiodlock_vs_best_peer")
    if ours is not None and peers and paired is not None:
        best_name = max(peers, key=lambda p: peers[p])
        best = peers[best_name]
        out.append(
            {
                "goal": "A: uncontended cycles/s >= 2 x the better peer",
                "measured": f"{paired}x (median of paired rounds); totals {ours:.0f} vs "
                f"{best_name} {best:.0f} = {ours / best:.2f}x",
                "status": "PASS" if paired >= 2 else "FAIL",
            }
        )
    seq = a.get("aiodlock-sequential", {}).get("cycles_per_s")
    paired = ratios.get("aiodlock_vs_sequential")
    if ours is not None and seq and paired is not None:
        out.append(
            {
                "goal": "A: uncontended cycles/s >= 3 x the sequential fan-out",
                "measured": f"{paired}x (median of paired rounds); totals {ours:.0f} vs "
                f"{seq:.0f} = {ours / seq:.2f}x",
                "status": "PASS" if paired >= 3 else "FAIL",
            }
        )
    b = results["B"].get("aiodlock", {})
    gap = b.get("handoff_gap", {}).get("p99_ms")
    if gap is not None:
        out.append(
            {
                "goal": "B: handoff gap p99 < 5 ms with 8 contending tasks",
                "measured": f"{gap} ms (p50 {b['handoff_gap']['p50_ms']} ms, "
                f"{b['owner_changes']} owner changes, violations {b['violations']})",
                "status": "PASS" if gap < 5 and not b["violations"] else "FAIL",
            }
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    meta, res = doc["meta"], doc["results"]
    lines = [
        *side_report_head("Redlock", "servers", meta),
        "| adapter | A: cycles/s | A: cycle p50 ms | A: client CPU us/cycle | B: acq/s "
        "| B: gap p50 ms | B: gap p99 ms | B: wait p99 ms | B: same owner | B: violations |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, a, b in side_rows(res, ADAPTERS):
        lines.append(
            f"| {name} | {a.get('cycles_per_s', a.get('error', ''))} "
            f"| {a.get('cycle', {}).get('p50_ms', '')} "
            f"| {a.get('client_cpu_us_per_cycle', '')} "
            f"| {b.get('acquisitions_per_s', b.get('error', ''))} "
            f"| {b.get('handoff_gap', {}).get('p50_ms', '')} "
            f"| {b.get('handoff_gap', {}).get('p99_ms', '')} "
            f"| {b.get('wait', {}).get('p99_ms', '')} | {b.get('same_owner_share', '')} "
            f"| {b.get('violations', '')} |"
        )
    ratios = res.get("A_ratios", {})
    lines += [
        "",
        f"Paired A ratios (median over rounds): aiodlock / best peer "
        f"{ratios.get('aiodlock_vs_best_peer')}, aiodlock / sequential "
        f"{ratios.get('aiodlock_vs_sequential')}.",
        "",
        "Targets:",
        "",
    ]
    lines += target_lines(doc)
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    cli = SideBenchmark(
        "redlock",
        __doc__,
        ADAPTERS,
        {"a_seconds": 0.1, "a_rounds": 60, "b_seconds": 5.0, "b_settle": 0.5},
        {"a_seconds": 0.05, "a_rounds": 4, "b_seconds": 0.5, "b_settle": 0.1},
    )
    cli.parser.add_argument("--hold-ms", type=float, default=0.0, help="time inside the lock in B")
    return cli.parse(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with redis_masters(NODES) as group:
        url = "redlock://" + group.hosts
        log(f"{NODES} redis masters: {group.hosts}")
        loadavg_before = loadavg()
        results = asyncio.run(run(args, url))
        version = group[0].cli("INFO", "server").splitlines()
    found = [x.split(":", 1)[1] for x in version if x.startswith("redis_version")]
    redis_version = found[0] if found else "?"
    text = save_run(
        out=args.out,
        name=args.name,
        module="benchmarks.redlock",
        argv=argv,
        server=f"{NODES} x redis-server {redis_version.strip()} on loopback, no persistence",
        packages=("aiodlock", "redis", "hiredis", "pottery", "aioredlock", "aioredis"),
        loadavg_before=loadavg_before,
        results=results,
        targets=targets,
        markdown=markdown,
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
