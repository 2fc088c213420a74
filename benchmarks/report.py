"""Targets (PASS/FAIL), ratios and the markdown tables of one run's results."""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "markdown", "ratio_lines"]

#: Growth allowed for the per-release traffic from the fewest to the most waiters.
TRAFFIC_GROWTH_LIMIT = 1.25


def _subject(results: dict[str, Any]) -> str | None:
    ran = results.get("adapters_run", [])
    for name in ("aiodlock", "memory"):
        if name in ran:
            return name
    return None


def _peers(results: dict[str, Any]) -> list[str]:
    roles = results.get("roles", {})
    return [name for name in results.get("adapters_run", []) if roles.get(name) == "peer"]


def _target(
    key: str, goal: str, measured: str, passed: bool | None, note: str = ""
) -> dict[str, Any]:
    status = "N/A" if passed is None else "PASS" if passed else "FAIL"
    return {"id": key, "goal": goal, "measured": measured, "status": status, "note": note}


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the issue, measured in this run."""
    subject = _subject(results)
    a = results.get("A", {})
    b = results.get("B", {})
    fair = results.get("B-fair", {})
    out: list[dict[str, Any]] = []
    smoke = "" if subject == "aiodlock" else "subject is not aiodlock redis:// (smoke run)"

    # A: >= 0.9x the floor (median over rounds of the ratio within each round)
    goal = "A: aiodlock >= 0.9x floor cycles/s"
    row = a.get(subject or "", {})
    ratio = row.get("ratio_to_floor")
    if ratio is not None and subject != "floor":
        cpu = row.get("cpu_ratio_to_floor")
        quartiles = row.get("ratio_to_floor_quartiles")
        spread = f", quartiles {quartiles[0]:.2f}-{quartiles[1]:.2f}" if quartiles else ""
        measured = (
            f"{ratio:.2f}x (median of {row['slices']} paired slices{spread}; all slices "
            f"{row['cycles_per_s']:.0f} vs {a['floor']['cycles_per_s']:.0f} cycles/s; "
            f"by client+server CPU per cycle {_fmt(cpu, 'x', 2)})"
        )
        out.append(_target("A-floor", goal, measured, ratio >= 0.9, smoke))
    else:
        out.append(_target("A-floor", goal, "not measured", None, smoke))

    # B: owner-change handoff gap
    run = b.get(subject or "", {})
    gap = run.get("handoff_gap", {})
    changes = run.get("owner_changes", 0)
    for key, goal, field, limit in (
        ("B-gap-p50", "B: owner-change handoff gap p50 < 0.5 ms", "p50_ms", 0.5),
        ("B-gap-p99", "B: owner-change handoff gap p99 < 2 ms", "p99_ms", 2.0),
    ):
        value = gap.get(field)
        if value is None or not changes:
            out.append(_target(key, goal, "not measured", None, smoke))
        else:
            rng = run.get("range", {}).get(f"gap_{field}")
            spread = f"; repeats {rng[0]:.3f}-{rng[1]:.3f} ms" if rng else ""
            measured = f"{value:.3f} ms ({changes} owner changes{spread})"
            out.append(_target(key, goal, measured, value < limit, smoke))

    # B: p99 wait ahead of every peer (per acquisition, as the issue states it); the
    # time-weighted p99 and the max are shown beside it because a lock that starves some
    # workers has few, long waits that a per-acquisition percentile hardly sees.
    goal = "B: p99 wait below every peer's"
    mine_wait = run.get("wait", {})
    mine = mine_wait.get("p99_ms")
    peers = {p: b[p]["wait"] for p in _peers(results) if "wait" in b.get(p, {})}
    if mine is None or not peers:
        out.append(_target("B-wait-p99", goal, "not measured", None, smoke))
    else:
        best_peer = min(peers, key=lambda p: peers[p]["p99_ms"])
        theirs = peers[best_peer]
        rng = run.get("range", {}).get("wait_p99_ms")
        spread = f" (repeats {rng[0]:.3f}-{rng[1]:.3f})" if rng else ""
        # NOTE: below 1% of owner changes a peer's p99 per acquisition is one of its
        # releasers' instant re-takes (docs/benchmarks.md): say so beside the verdict.
        peer_run = b.get(best_peer, {})
        changes, acquisitions = peer_run.get("owner_changes"), peer_run.get("acquisitions")
        share = (
            f", owner changes in {changes / acquisitions * 100:.1f}% of its acquisitions"
            if changes is not None and acquisitions
            else ""
        )
        measured = (
            f"{mine:.3f} ms{spread} vs best peer {best_peer} {theirs['p99_ms']:.3f} ms{share} "
            f"(time-weighted p99 {_fmt(mine_wait.get('p99_time_weighted_ms'), ' ms', 1)} vs "
            f"{_fmt(theirs.get('p99_time_weighted_ms'), ' ms', 1)}; max "
            f"{_fmt(mine_wait.get('max_ms'), ' ms', 1)} vs {_fmt(theirs.get('max_ms'), ' ms', 1)})"
        )
        out.append(_target("B-wait-p99", goal, measured, mine < theirs["p99_ms"], smoke))
        tw_mine = mine_wait.get("p99_time_weighted_ms")
        tw_peers = {p: w.get("p99_time_weighted_ms") for p, w in peers.items()}
        if tw_mine is not None and all(v is not None for v in tw_peers.values()):
            best_tw = min(tw_peers, key=lambda p: tw_peers[p])  # type: ignore[arg-type,return-value]
            out.append(
                _target(
                    "B-wait-p99-time-weighted",
                    "B (extra reading): time-weighted p99 wait below every peer's",
                    f"{tw_mine:.1f} ms vs best peer {best_tw} {tw_peers[best_tw]:.1f} ms",
                    tw_mine < tw_peers[best_tw],  # type: ignore[operator]
                    smoke,
                )
            )

    # B fair: every worker within 10% of the mean
    goal = "B fair=True: every worker within 10% of the mean acquisitions"
    run = fair.get(subject or "", {})
    spread = run.get("max_deviation_from_mean")
    if spread is None:
        out.append(_target("B-fair-spread", goal, "not measured", None, smoke))
    else:
        measured = (
            f"max deviation {spread * 100:.1f}% (most uneven repeat: min "
            f"{run['per_worker_min']}, max {run['per_worker_max']} acquisitions per worker)"
        )
        out.append(_target("B-fair-spread", goal, measured, spread <= 0.10, smoke))

    # release-to-wake traffic in fair mode
    goal = (
        f"fair mode: release-to-wake traffic does not grow with waiting clients "
        f"(<= {TRAFFIC_GROWTH_LIMIT}x from fewest to most)"
    )
    series = results.get("traffic", {}).get(f"{subject}:fair", [])
    series = [row for row in series if "commands_per_release" in row]
    if len(series) < 2:
        out.append(_target("traffic-fair", goal, "not measured", None, smoke))
    else:
        low, high = series[0], series[-1]
        cmd_growth = high["commands_per_release"] / max(low["commands_per_release"], 1e-9)
        byte_growth = high["out_bytes_per_release"] / max(low["out_bytes_per_release"], 1e-9)
        measured = (
            f"commands/release {low['commands_per_release']:.2f} -> "
            f"{high['commands_per_release']:.2f} ({cmd_growth:.2f}x), out bytes/release "
            f"{low['out_bytes_per_release']:.0f} -> {high['out_bytes_per_release']:.0f} "
            f"({byte_growth:.2f}x), {low['waiters']} -> {high['waiters']} waiters"
        )
        passed = cmd_growth <= TRAFFIC_GROWTH_LIMIT and byte_growth <= TRAFFIC_GROWTH_LIMIT
        out.append(_target("traffic-fair", goal, measured, passed, smoke))

    # mutual exclusion everywhere
    bad: list[str] = []
    checked = 0
    for workload in ("B", "B-fair", "C"):
        for adapter, row in results.get(workload, {}).items():
            if "violations" in row:
                checked += 1
                if row["violations"] or row.get("overlapping_intervals"):
                    bad.append(f"{workload}/{adapter}")
    for spec, rows in results.get("traffic", {}).items():
        for row in rows:
            if "violations" in row:
                checked += 1
                if row["violations"]:
                    bad.append(f"traffic/{spec}/{row['waiters']}")
    goal = "mutual exclusion: 0 violations in every contention run"
    measured = f"{checked} runs checked, violations in: {', '.join(bad) or 'none'}"
    out.append(_target("exclusion", goal, measured, None if not checked else not bad))
    return out


def ratio_lines(results: dict[str, Any]) -> list[str]:
    """Human-readable ratios against the floor and the peers."""
    lines: list[str] = []
    subject = _subject(results)
    for workload in ("A", "C"):
        for name, row in results.get(workload, {}).items():
            if row.get("ratio_to_floor") is not None:
                lines.append(
                    f"{workload}: {name:<18} {row['cycles_per_s']:>7.0f} cycles/s, "
                    f"{row['ratio_to_floor']:.2f}x floor (median of paired slices), "
                    f"{_fmt(row.get('cpu_ratio_to_floor'), 'x', 2)} by CPU per cycle"
                )
    b = results.get("B", {})
    mine = b.get(subject or "", {})
    if "wait" in mine:
        for peer in _peers(results):
            theirs = b.get(peer, {})
            if "wait" not in theirs:
                continue
            for label, key in (("wait p99", "wait"), ("gap p50", "handoff_gap")):
                field = "p99_ms" if label.endswith("p99") else "p50_ms"
                m, t = mine[key].get(field), theirs[key].get(field)
                if m and t:
                    lines.append(
                        f"B: {label} {subject} {m:.3f} ms vs {peer} {t:.3f} ms "
                        f"({t / m:.1f}x {'better' if t > m else 'worse'})"
                    )
    return lines


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(results: dict[str, Any], targets: list[dict[str, Any]]) -> str:
    meta = results.get("meta", {})
    lines = [
        f"## Benchmark run `{meta.get('name')}`: {meta.get('date')}",
        "",
        f"- command: `{meta.get('command')}`",
        f"- machine: {meta.get('machine')}",
        f"- load average before/after: {meta.get('loadavg_before')} / {meta.get('loadavg_after')}",
        f"- server: {meta.get('server')}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta.get('versions', {}).items())}",
        f"- git: {meta.get('git')}; digest of aiodlock/**/*.py: {meta.get('aiodlock_sources')}",
        "",
    ]
    for workload, title in (
        ("A", "A: one task, one name (acquire + release cycles)"),
        ("C", "C: many tasks, each on its own name"),
    ):
        rows = results.get(workload, {})
        if not rows:
            continue
        first = next((r for r in rows.values() if r.get("slices")), {})
        tasks = first.get("tasks")
        lines += [
            f"### {title}"
            + (f" ({tasks} tasks)" if tasks and tasks > 1 else "")
            + (
                f": {first['slices']} rounds of {first['slice_seconds']:g} s slices"
                if first
                else ""
            ),
            "",
            "| adapter | cycles/s | cycles/s, median slice | cycle p50 ms | cycle p99 ms "
            "| vs floor (median of paired slices) | client CPU µs/cycle | server CPU µs/cycle "
            "| vs floor by CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in rows.items():
            if "cycles_per_s" not in row:
                lines.append(f"| {name} | error: {row.get('error')} | | | | | | | |")
                continue
            ratio = row.get("ratio_to_floor")
            cpu_ratio = row.get("cpu_ratio_to_floor")
            lines.append(
                f"| {name} | {row['cycles_per_s']:.0f} | {row['median_cycles_per_s']:.0f} | "
                f"{_cell(row['cycle']['p50_ms'])} | {_cell(row['cycle']['p99_ms'])} | "
                f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | "
                f"{_cell(row.get('client_cpu_us_per_cycle'), 1)} | "
                f"{_cell(row.get('server_cpu_us_per_cycle'), 1)} | "
                f"{'n/a' if cpu_ratio is None else f'{cpu_ratio:.2f}x'} |"
            )
        lines.append("")
    for workload, title in (
        ("B", "B: contention, one name"),
        ("B-fair", "B with fair=True"),
    ):
        rows = results.get(workload, {})
        if not rows:
            continue
        any_row = next(iter(rows.values()))
        lines += [
            f"### {title} ({any_row.get('workers', '?')} tasks; "
            f"{any_row.get('repeats', 1)} x {any_row.get('seconds', '?')} s measured after "
            f"{any_row.get('settle_seconds', 0):g} s of settling; hold "
            f"{any_row.get('hold_ms', 0):g} ms; medians over the repeats, max and counts "
            f"over all)",
            "",
            "| adapter | acq/s | wait p50 ms | wait p99 ms | wait p99 ms, time-weighted "
            "| wait max ms | gap p50 ms | gap p99 ms | owner changes | releaser took it back "
            "| per worker min/max (most uneven repeat) | violations |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for name, row in rows.items():
            if "wait" not in row:
                lines.append(f"| {name} | error: {row.get('error')} | | | | | | | | | | |")
                continue
            share = row["same_owner_share"]
            lines.append(
                f"| {name} | {row['acquisitions_per_s']:.0f} | {_cell(row['wait']['p50_ms'])} | "
                f"{_cell(row['wait']['p99_ms'])} | "
                f"{_cell(row['wait'].get('p99_time_weighted_ms'), 1)} | "
                f"{_cell(row['wait']['max_ms'], 1)} | "
                f"{_cell(row['handoff_gap']['p50_ms'])} | "
                f"{_cell(row['handoff_gap']['p99_ms'])} | {row['owner_changes']} | "
                f"{'n/a' if share is None else f'{share * 100:.1f}%'} | "
                f"{row['per_worker_min']}/{row['per_worker_max']} | "
                f"{row['violations'] + row['overlapping_intervals']} |"
            )
        for name, row in rows.items():
            errors = [e for e in row.get("errors", []) if e and e != "None"]
            if errors or row.get("aborted"):
                drained = "did not drain (aborted); " if row.get("aborted") else ""
                lines.append(f"\n{name}: {drained}worker errors: {'; '.join(errors) or 'none'}")
        lines.append("")
    traffic = results.get("traffic", {})
    if traffic:
        lines += [
            "### Release-to-wake traffic (N clients, one waiter each, one name)",
            "",
            "| adapter | waiting clients | subscribed connections | releases | clients that got "
            "it | commands/release | scripts/release | (un)subscribes/release | PUBLISH/release "
            "| bytes out/release | bytes in/release | top commands (delta) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for spec, series in traffic.items():
            for row in series:
                if "commands_per_release" not in row:
                    lines.append(f"| {spec} | {row.get('waiters')} | error: {row.get('error')} |")
                    continue
                top = sorted(row["commands"].items(), key=lambda kv: -kv[1])[:5]
                lines.append(
                    f"| {spec} | {row['waiters']} | {row['subscribed_clients']} | "
                    f"{row['releases']} | {row['distinct_holders']} | "
                    f"{row['commands_per_release']:.2f} | {row['scripts_per_release']:.2f} | "
                    f"{row['subscribe_calls_per_release']:.2f} | "
                    f"{row['publish_per_release']:.2f} | "
                    f"{row['out_bytes_per_release']:.0f} | {row['in_bytes_per_release']:.0f} | "
                    f"{', '.join(f'{k} {v}' for k, v in top)} |"
                )
        lines.append("")
    skipped = results.get("skipped", {})
    if skipped:
        lines += ["### Skipped adapters", ""]
        lines += [f"- {name}: {reason}" for name, reason in skipped.items()]
        lines.append("")
    lines += ["### Targets", "", "| target | measured | result |", "|---|---|---|"]
    for t in targets:
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['goal']} | {t['measured']}{note} | **{t['status']}** |")
    lines.append("")
    return "\n".join(lines)
