"""The reports of ``python -m benchmarks.suite``: the normalised rows read from each
benchmark's own JSON, the summary (aiodlock against its best peer and its floor), the
markdown table, the JSON file and the PNG chart.

A *row* is one library on one backend: ``{"backend", "name", "role", "cycles_per_s",
"handoff_p50_ms", "handoff_p99_ms", "note"}``, ``role`` one of ``aiodlock`` (the backend's
default), ``variant`` (another aiodlock strategy), ``peer`` or ``floor``; a value a
benchmark does not measure is None.  A row of a benchmark that measures A in paired slices
(:mod:`benchmarks.paired`) also holds ``floor_ratio``, the median of its ratios to the floor
within a round, which the summary shows instead of the ratio of the two medians.  An *E
row* is workload E on one backend (4 processes x 2 tasks on one name): ``{"backend",
"handoff_p50_ms", "handoff_p99_ms", "handoffs", "share_min_max_ratio", "shares",
"verdict"}``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "chart",
    "e_row",
    "etcd_rows",
    "markdown",
    "mysql_rows",
    "postgres_rows",
    "side_rows",
    "summary",
    "write",
]

ROLES = ("aiodlock", "variant", "peer", "floor")


def _row(
    backend: str,
    name: str,
    role: str,
    a: Any,
    b: dict[str, Any] | None,
    note: str = "",
    floor_ratio: float | None = None,
) -> dict[str, Any]:
    b = b or {}
    paired = {} if floor_ratio is None else {"floor_ratio": round(float(floor_ratio), 3)}
    return {
        "backend": backend,
        "name": name,
        "role": role,
        "cycles_per_s": None if a is None else round(float(a), 1),
        "handoff_p50_ms": None if b.get("p50_ms") is None else round(float(b["p50_ms"]), 3),
        "handoff_p99_ms": None if b.get("p99_ms") is None else round(float(b["p99_ms"]), 3),
        "handoffs": b.get("n"),
        "note": note,
        **paired,
    }


# -- readers: one benchmark's JSON -> rows ----------------------------------------------------


def side_rows(
    backend: str, doc: dict[str, Any], roles: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Rows of a runner-style result (``python -m benchmarks``, ``.redlock``,
    ``.zookeeper``, ``.sqlite``): ``A[name].cycles_per_s``, ``B[name].handoff_gap``."""
    res = doc.get("results", doc)
    roles = {**doc.get("roles", {}), **(roles or {})}
    a, b = res.get("A", {}), res.get("B", {})
    rows = []
    for name in dict.fromkeys([*a, *b]):
        ra = a.get(name) if isinstance(a.get(name), dict) else {}
        rb = b.get(name) if isinstance(b.get(name), dict) else {}
        if not ra and not rb:
            continue
        role = roles.get(name) or ("aiodlock" if name == "aiodlock" else "peer")
        if role == "smoke":  # (memory://: aiodlock alone)
            name = "aiodlock"
        role = {"subject": "aiodlock", "floor-variant": "variant", "smoke": "aiodlock"}.get(
            role, role
        )
        error = ra.get("error") or rb.get("error") or ""
        rows.append(_row(backend, name, role, ra.get("cycles_per_s"), rb.get("handoff_gap"), error))
    return rows


def etcd_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``python -m benchmarks.etcd --json``: A for aiodlock and aetcd, B for aiodlock."""
    a, b = doc.get("A", {}), doc.get("B", {})
    rows = [_row("etcd", "aiodlock", "aiodlock", a.get("aiodlock"), b.get("aiodlock"))]
    if a.get("aetcd") is not None:
        rows.append(_row("etcd", "aetcd", "peer", a["aetcd"], None, "A only"))
    return rows


def postgres_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``python -m benchmarks.postgres --json``: A against the floor, B against polling."""
    a, b = doc.get("A", {}), doc.get("B", {})

    def median(values: Sequence[float] | None) -> float | None:
        return statistics.median(values) if values else None

    ours = median(a.get("aiodlock"))
    return [
        _row(
            "postgres", "aiodlock", "aiodlock", ours, b.get("aiodlock"), "", a.get("ratio_median")
        ),
        _row("postgres", "polling 0.1 s", "peer", None, b.get("polling"), "B only"),
        _row("postgres", "floor", "floor", median(a.get("floor")), None),
    ]


def mysql_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``python -m benchmarks.mysql --json``: each strategy and the floor (A only), per
    driver (the first one measured is the default's row; the others are variants).  Where
    the benchmark reports no p99, its hand-off column holds the max (noted)."""
    rows = []
    drivers = doc.get("drivers") or [None]
    for driver in drivers:
        part = doc if driver is None else doc.get(driver, {})
        default = driver in (None, drivers[0])
        suffix = "" if default else f" ({driver})"
        for strategy in ("table", "named", "row"):
            r = part.get(strategy)
            if not isinstance(r, dict):
                continue
            p99, note = r.get("handoff_p99_ms"), ""
            if p99 is None and r.get("handoff_max_ms") is not None:
                p99, note = r["handoff_max_ms"], "hand-off p99 column: max"
            gap = {"p50_ms": r.get("handoff_p50_ms"), "p99_ms": p99}
            role = "aiodlock" if strategy == "table" and default else "variant"
            label = f"aiodlock {strategy}{suffix}"
            ratio = r.get("ratio")
            rows.append(_row("mysql", label, role, r.get("cycles_per_s"), gap, note, ratio))
        if default and part.get("floor") is not None:
            rows.append(_row("mysql", "floor", "floor", part["floor"], None))
    return rows


def e_row(backend: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Workload E from ``python -m benchmarks.crossprocess --save``'s JSON."""
    res = doc.get("results", doc)
    gap = res.get("cross_process_handoff_gap", {})
    return {
        "backend": backend,
        "handoff_p50_ms": gap.get("p50_ms"),
        "handoff_p99_ms": gap.get("p99_ms"),
        "handoffs": gap.get("n"),
        "acquisitions": res.get("acquisitions"),
        "expected": res.get("expected"),
        "share_min_max_ratio": res.get("share_min_max_ratio"),
        "shares": res.get("share_at_first_finish"),
        "verdict": res.get("verdict"),
    }


# -- the summary: aiodlock against its best peer and its floor ------------------------------


def summary(
    rows: Iterable[dict[str, Any]], e_rows: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One entry per backend (in the order first seen): aiodlock's row, the peer with the
    most cycles/s, the peer with the lowest hand-off p99, the floor and workload E."""
    rows = list(rows)
    e_by = {e["backend"]: e for e in e_rows}
    backends = list(dict.fromkeys([*(r["backend"] for r in rows), *e_by]))
    out = []
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend]
        peers = [r for r in mine if r["role"] == "peer"]
        fast = [r for r in peers if r["cycles_per_s"] is not None]
        quick = [r for r in peers if r["handoff_p99_ms"] is not None]
        out.append(
            {
                "backend": backend,
                "aiodlock": next((r for r in mine if r["role"] == "aiodlock"), None),
                "peer_a": max(fast, key=lambda r: r["cycles_per_s"]) if fast else None,
                "peer_b": min(quick, key=lambda r: r["handoff_p99_ms"]) if quick else None,
                "floor": next((r for r in mine if r["role"] == "floor"), None),
                "E": e_by.get(backend),
            }
        )
    return out


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _gap(p50: Any, p99: Any) -> str:
    return "–" if p50 is None and p99 is None else f"{_num(p50, 2)} / {_num(p99, 2)}"


def markdown(doc: dict[str, Any]) -> str:
    """The summary table, every row measured, workload E and the run's settings."""
    meta = doc["meta"]
    lines = [
        f"# Benchmark suite `{meta['name']}`",
        "",
        f"- {meta['date']}, `{meta['command']}`, {meta['wall_seconds']} s wall time",
        f"- {meta['machine']}; load average before/after {meta['loadavg_before']} / "
        f"{meta['loadavg_after']}; git {meta['git']}",
        "",
        "A: one task, uncontended acquire + release cycles/s. B: the hand-off gap (a "
        "holder's release to the next holder's entry) while clients or tasks contend, "
        "p50 / p99 ms. E: 4 OS processes x 2 tasks on one name, hand-off gap between "
        "processes p50 / p99 ms, and fairness: each process's acquisitions when the first "
        "process finished, least / most. Each backend's own benchmark defines A and B "
        "(docs/benchmarks.md); compare within a row, not across backends.",
        "",
        "| backend | A aiodlock | A best peer | A floor | aiodlock / floor "
        "| B aiodlock ms | B best peer ms | E gap ms | E fairness |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for s in summary(doc["rows"], doc["E"]):
        me, pa, pb, fl, e = s["aiodlock"], s["peer_a"], s["peer_b"], s["floor"], s["E"]
        ours = me["cycles_per_s"] if me else None
        floor = fl["cycles_per_s"] if fl else None
        paired = me.get("floor_ratio") if me else None
        if paired is not None:
            ratio = f"{paired:.2f} (paired)"
        else:
            ratio = f"{ours / floor:.2f}" if ours and floor else "–"
        peer_a = f"{_num(pa['cycles_per_s'])} ({pa['name']})" if pa else "–"
        peer_b = f"{_gap(pb['handoff_p50_ms'], pb['handoff_p99_ms'])} ({pb['name']})" if pb else "–"
        gap_me = _gap(me["handoff_p50_ms"], me["handoff_p99_ms"]) if me else "–"
        gap_e = _gap(e["handoff_p50_ms"], e["handoff_p99_ms"]) if e else "–"
        fairness = _num(e["share_min_max_ratio"], 2) if e else "–"
        lines.append(
            f"| {s['backend']} | {_num(ours)} | {peer_a} | {_num(floor)} | {ratio} | {gap_me} "
            f"| {peer_b} | {gap_e} | {fairness} |"
        )
    lines += [
        "",
        "## Every row",
        "",
        "| backend | library | role | A cycles/s | B p50 ms | B p99 ms | B hand-offs | note |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['backend']} | {r['name']} | {r['role']} | {_num(r['cycles_per_s'])} "
            f"| {_num(r['handoff_p50_ms'], 2)} | {_num(r['handoff_p99_ms'], 2)} "
            f"| {_num(r.get('handoffs'))} | {r['note']} |"
        )
    lines += [
        "",
        "## E: 4 processes x 2 tasks on one name",
        "",
        "| backend | acquisitions | hand-offs across processes | gap p50 ms | gap p99 ms "
        "| per process at first finish | least / most | verdict |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for e in doc["E"]:
        shares = "/".join(map(str, e["shares"] or []))
        lines.append(
            f"| {e['backend']} | {e['acquisitions']} of {e['expected']} | {e['handoffs']} "
            f"| {_num(e['handoff_p50_ms'], 2)} | {_num(e['handoff_p99_ms'], 2)} | {shares} "
            f"| {_num(e['share_min_max_ratio'], 2)} | {e['verdict']} |"
        )
    failed = [s for s in doc["steps"] if s.get("error")]
    if failed:
        lines += ["", "## Steps that failed", ""]
        lines += [f"- {s['id']}: {s['error']}" for s in failed]
    return "\n".join(lines) + "\n"


# -- the chart --------------------------------------------------------------------------------

COLOURS = {"aiodlock": "#1f5fa8", "peer": "#e08a1e", "floor": "#8c8c8c", "E": "#7fb3e6"}


def _tick(value: float) -> str:
    """An axis tick: 0.1, 1, 10, 100, 1k, 10k, 100k, 1M."""
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def chart(doc: dict[str, Any], path: Path) -> None:
    """Two panels, one group of bars per backend: cycles/s (aiodlock, its fastest peer, its
    floor) and hand-off p99 (aiodlock, its quickest peer, aiodlock across 4 processes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    entries = summary(doc["rows"], doc["E"])
    n = len(entries)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 2.2 + 1.05 * n), dpi=100)
    panels = (
        (
            top,
            "A: uncontended acquire + release, cycles/s (log scale; more is better)",
            [
                ("aiodlock", "aiodlock", lambda s: s["aiodlock"], "cycles_per_s"),
                ("peer", "fastest peer", lambda s: s["peer_a"], "cycles_per_s"),
                ("floor", "floor (raw commands)", lambda s: s["floor"], "cycles_per_s"),
            ],
            "cycles/s",
        ),
        (
            bottom,
            "B / E: hand-off gap p99, ms (log scale; less is better)",
            [
                ("aiodlock", "aiodlock (B)", lambda s: s["aiodlock"], "handoff_p99_ms"),
                ("peer", "quickest peer (B)", lambda s: s["peer_b"], "handoff_p99_ms"),
                ("E", "aiodlock, 4 processes x 2 tasks (E)", lambda s: s["E"], "handoff_p99_ms"),
            ],
            "ms",
        ),
    )
    height = 0.27
    for ax, title, series, unit in panels:
        values_seen: list[float] = []
        labelled: set[str] = set()
        for k, (colour, label, pick, key) in enumerate(series):
            for i, s in enumerate(entries):
                row = pick(s)
                value = row.get(key) if row else None
                y = i + (k - 1) * height
                if value is None or value <= 0:
                    missing = {"peer": "no peer measured", "floor": "no floor", "E": "E not run"}
                    if colour in missing:
                        ax.text(0.006, y, missing[colour], va="center", fontsize=7,
                                color="#888888", style="italic",
                                transform=ax.get_yaxis_transform())  # fmt: skip
                    continue
                values_seen.append(value)
                first = label not in labelled
                labelled.add(label)
                ax.barh(y, value, height=height * 0.92, color=COLOURS[colour],
                        label=label if first else None)  # fmt: skip
                text = f" {value:,.0f}" if unit == "cycles/s" else f" {value:.3g}"
                if colour == "peer" and row.get("name"):
                    text += f" {row['name']}"
                if key == "handoff_p99_ms" and "max" in row.get("note", ""):
                    text += " (max)"
                ax.text(value, y, text, va="center", fontsize=8)
        ax.set_xscale("log")
        if values_seen:
            ax.set_xlim(min(values_seen) / 2, max(values_seen) * 7)
        ax.set_yticks(range(n), [s["backend"] for s in entries], fontsize=10)
        ax.set_ylim(n - 0.5, -0.5)  # (the first backend on top)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(unit, fontsize=9)
        ax.set_title(title, fontsize=10, loc="left", pad=22)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tick(v)))
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False,
                  borderaxespad=0.2, handlelength=1.2, columnspacing=1.2)  # fmt: skip
    meta = doc["meta"]
    footer = (
        f"{meta['date']}, {meta['machine'].split(',')[0]}, load {meta['loadavg_before']}; "
        f"{meta['command']}"
    )
    fig.text(0.01, 0.005, footer, fontsize=6.5, color="#555555")
    fig.tight_layout(rect=(0, 0.015, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(doc: dict[str, Any], out: Path, name: str) -> tuple[Path, Path, Path]:
    """``<out>/<name>.json``, ``.md`` and ``.png``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"
    paths[0].write_text(json.dumps(doc, indent=2) + "\n")
    paths[1].write_text(markdown(doc))
    chart(doc, paths[2])
    return paths
