"""Smoke tests of ``python -m benchmarks.suite``: its arguments, its readers of each
benchmark's JSON, and its writers (markdown, JSON, PNG) on a small fake result.  No server
and no benchmark runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("rich")

from benchmarks import suite, suite_report


def fake_doc() -> dict[str, object]:
    """A run as ``suite.run`` records it: rows read back through the suite's own readers."""
    redis = {
        "roles": {"aiodlock": "subject", "floor": "floor", "pottery": "peer", "redis-py": "peer"},
        "A": {
            "aiodlock": {"cycles_per_s": 5000.0},
            "floor": {"cycles_per_s": 4000.0},
            "pottery": {"cycles_per_s": 1200.0},
            "redis-py": {"cycles_per_s": 1500.0},
        },
        "B": {
            "aiodlock": {"handoff_gap": {"p50_ms": 0.1, "p99_ms": 2.5}},
            "pottery": {"handoff_gap": {"p50_ms": 3.0, "p99_ms": 9.0}},
            "redis-py": {"handoff_gap": {"p50_ms": 50.0, "p99_ms": 99.0}},
        },
    }
    rows = [
        *suite_report.side_rows("redis", redis),
        *suite_report.etcd_rows(
            {
                "A": {"aiodlock": 900.0, "aetcd": 700.0},
                "B": {"aiodlock": {"p50_ms": 2, "p99_ms": 8}},
            }
        ),
        *suite_report.mysql_rows(
            {
                "floor": 4000.0,
                "table": {
                    "cycles_per_s": 450.0,
                    "ratio": 0.125,  # (paired: not 450 / 4000)
                    "handoff_p50_ms": 5.0,
                    "handoff_max_ms": 6.0,
                },
                "named": {"cycles_per_s": 1200.0, "handoff_p50_ms": 4.0, "handoff_max_ms": 7.0},
            }
        ),
        *suite_report.postgres_rows(
            {
                "A": {
                    "floor": [9000.0, 11000.0],
                    "aiodlock": [4000.0, 5000.0],
                    "ratio_median": 0.47,  # (paired: the median of 4000/9000 and 5000/11000)
                },
                "B": {"aiodlock": {"p50_ms": 1.0, "p99_ms": 7.0}, "polling": {"p99_ms": 95.0}},
            }
        ),
    ]
    crossprocess = {
        "results": {
            "acquisitions": 800,
            "expected": 800,
            "cross_process_handoff_gap": {"n": 500, "p50_ms": 0.4, "p99_ms": 1.7},
            "share_at_first_finish": [190, 200, 180, 170],
            "share_min_max_ratio": 0.85,
            "verdict": "PASS",
        }
    }
    meta = {
        "name": "fake",
        "date": "2026-01-01 00:00:00 UTC",
        "command": "python -m benchmarks.suite --quick",
        "machine": "2 CPUs (test), Linux",
        "loadavg_before": "0.10 0.10 0.10",
        "loadavg_after": "0.20 0.10 0.10",
        "git": "abc1234",
        "quick": True,
        "wall_seconds": 1.0,
    }
    steps = [{"id": "zookeeper A/B", "error": "exit 1; see zookeeper.log"}]
    return {
        "meta": meta,
        "steps": steps,
        "rows": rows,
        "E": [suite_report.e_row("redis", crossprocess)],
    }


def test_summary_picks_the_best_peer_per_measure_and_the_floor() -> None:
    by_backend = {
        s["backend"]: s for s in suite_report.summary(fake_doc()["rows"], fake_doc()["E"])
    }
    redis = by_backend["redis"]
    assert redis["aiodlock"]["cycles_per_s"] == 5000.0
    assert redis["peer_a"]["name"] == "redis-py"  # the most cycles/s among the peers
    assert redis["peer_b"]["name"] == "pottery"  # the lowest hand-off p99 among the peers
    assert redis["floor"]["cycles_per_s"] == 4000.0
    assert redis["E"]["share_min_max_ratio"] == 0.85
    assert by_backend["etcd"]["peer_a"]["name"] == "aetcd"
    assert by_backend["etcd"]["peer_b"] is None  # aetcd's A only
    assert by_backend["mysql"]["aiodlock"]["name"] == "aiodlock table"  # the default strategy
    assert by_backend["mysql"]["aiodlock"]["handoff_p99_ms"] == 6.0  # the max, noted
    assert by_backend["postgres"]["floor"]["cycles_per_s"] == 10000.0  # the median of rounds
    assert by_backend["postgres"]["peer_b"]["handoff_p99_ms"] == 95.0


def test_writer_makes_markdown_json_and_a_png(tmp_path: Path) -> None:
    doc = fake_doc()
    json_path, md_path, png_path = suite_report.write(doc, tmp_path, "fake")
    assert json.loads(json_path.read_text()) == doc
    text = md_path.read_text()
    assert (
        "| redis | 5,000 | 1,500 (redis-py) | 4,000 | 1.25 | 0.10 / 2.50 | 3.00 / 9.00 (pottery)"
        in text
    )
    assert "| redis | 800 of 800 | 500 | 0.40 | 1.70 | 190/200/180/170 | 0.85 | PASS |" in text
    # (a benchmark that pairs its slices gives its own ratio; the others, the medians')
    assert "| postgres | 4,500 | – | 10,000 | 0.47 (paired) |" in text
    assert "| mysql | 450 | – | 4,000 | 0.12 (paired) |" in text
    assert "zookeeper A/B: exit 1" in text  # a failed step is reported, not hidden
    png = png_path.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width = int.from_bytes(png[16:20], "big")
    assert width == 800  # the size docs/benchmarks.md shows it at
    assert len(png) < 150_000


def test_quick_arguments_and_plan() -> None:
    args = suite.parse_args(["--quick"])
    assert args.quick
    assert args.name == "suite-quick"
    assert args.backends == list(suite.BACKENDS)
    plan = suite.steps(args.quick, args.backends)
    assert [s.backend for s in plan if s.workload == "AB"] == list(suite.BACKENDS)
    assert [s.backend for s in plan if s.workload == "E"] == list(suite.E_BACKENDS)
    for step in plan:
        command = step.command(Path("/tmp/parts"))
        assert "--quick" in command or step.workload == "E", command
        assert any("/tmp/parts" in part for part in command), command
    e = next(s for s in plan if s.id == "etcd E").command(Path("/p"))
    assert e[e.index("--processes") + 1] == "4"
    assert e[e.index("--tasks") + 1] == "2"
    assert e[e.index("--acquisitions") + 1] == "25"


def test_unknown_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        suite.parse_args(["--backends", "redis,oracle"])
    assert "unknown backend(s) oracle" in capsys.readouterr().err


def test_a_failing_step_is_reported_with_its_log(tmp_path: Path) -> None:
    lines: list[str] = []

    def run(args: list[str]) -> str:
        step = suite.Step("x A/B", "x", "AB", args, "x.json", lambda doc: [])
        return suite._run_step(step, tmp_path, 30.0, lines.append)

    error = run(["benchmarks.suite", "--backends", "oracle"])
    assert error.startswith("exit 2; see ")
    log = (tmp_path / "x-AB.log").read_text()
    assert "unknown backend(s) oracle" in log
    assert any("unknown backend(s) oracle" in line for line in lines)  # shown while it runs
    assert run(["benchmarks.suite", "--help"]).startswith("wrote no x.json")
