"""Smoke tests of ``python -m benchmarks.crossprocess``: workers start together, record, and
the report adds up.  Nothing is timed: the assertions are about counts and structure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import crossprocess


def _doc(pid: int, records: list[tuple[int, float, float, float]]) -> dict[str, Any]:
    return {"pid": pid, "started": 0.0, "start_at": 0.0, "records": records, "errors": []}


@pytest.mark.parametrize(("scale", "verdict"), [(1.0, "FAIL"), (0.01, "PASS")])
def test_analyse_counts_handoffs_shares_and_judges(scale: float, verdict: str) -> None:
    # (task, requested, entered, exited); by entry: P0, P1, P0, P1, each next one waiting.
    p0 = [(0, 0.0, 0.0, 1.0), (0, 1.0, 2.5, 3.0)]
    p1 = [(0, 0.5, 1.2, 2.0), (0, 2.0, 3.1, 4.0)]
    docs = [
        _doc(1, [(t, r * scale, e * scale, x * scale) for t, r, e, x in p0]),
        _doc(2, [(t, r * scale, e * scale, x * scale) for t, r, e, x in p1]),
    ]
    res = crossprocess.analyse(docs, tasks=1, acquisitions=2)
    assert res["acquisitions"] == res["expected"] == 4
    assert res["owner_changes"] == res["cross_process_owner_changes"] == 3
    assert res["handoff_gap"]["n"] == 3
    assert res["handoff_gap"]["p50_ms"] == pytest.approx(200 * scale)  # gaps 0.2, 0.5, 0.1 s
    assert res["wait"]["max_ms"] == pytest.approx(1500 * scale)
    assert res["first_finish_s"] == pytest.approx(3.0 * scale)
    assert res["share_at_first_finish"] == [2, 1]  # P1's second entry came after P0 finished
    assert res["share_min_max_ratio"] == 0.5
    assert res["overlapping_intervals"] == 0
    assert res["verdict"] == verdict  # the 1.5 s wait fails it; 15 ms does not


def test_sqlite_run_adds_up() -> None:
    argv = ["--backend", "sqlite", "--processes", "2", "--tasks", "2", "--acquisitions", "5"]
    res = crossprocess.run(crossprocess.parse_args([*argv, "--timeout", "120"]))
    for key in ("handoff_gap", "cross_process_handoff_gap", "wait", "per_process", "verdict"):
        assert key in res
    assert res["acquisitions"] == res["expected"] == 20
    assert res["wait"]["n"] == 20
    assert res["overlapping_intervals"] == 0  # mutual exclusion across the processes
    per = res["per_process"]
    assert [p["acquisitions"] for p in per] == [10, 10]
    assert all(not p["errors"] and p["finished_s"] is not None for p in per)
    assert len({p["pid"] for p in per}) == 2  # two processes
    shares = res["share_at_first_finish"]
    assert max(shares) == 10  # the first process to finish: all of its own
    assert all(0 <= s <= 10 for s in shares)
    assert res["share_min_max_ratio"] == round(min(shares) / max(shares), 4)
    assert res["first_finish_s"] == min(p["finished_s"] for p in per)
    assert 1 <= res["cross_process_owner_changes"] <= res["owner_changes"] <= 19
    assert res["handoff_gap"]["n"] <= res["owner_changes"]
    assert res["cross_process_handoff_gap"]["n"] <= res["cross_process_owner_changes"]
    passed = res["share_min_max_ratio"] >= 0.5 and res["wait"]["max_ms"] <= 100
    assert res["verdict"] == ("PASS" if passed else "FAIL")
    assert any(line.startswith("Verdict: ") for line in crossprocess.report_lines(res))


def test_main_saves_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--backend", "sqlite", "--processes", "2", "--tasks", "1", "--acquisitions", "3"]
    assert crossprocess.main([*argv, "--save", "--out", str(tmp_path), "--name", "smoke"]) == 0
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert doc["results"]["acquisitions"] == 6
    assert doc["targets"][0]["status"] == doc["results"]["verdict"]
    assert "Verdict: " in (tmp_path / "smoke.md").read_text()
    assert "Verdict: " in capsys.readouterr().out


def test_a_refused_fair_lock_is_reported() -> None:
    # (Redlock has no fair locks; SQLite has since its line of waiters)
    argv = ["--backend", "redlock", "--processes", "1", "--fair", "--timeout", "60"]
    with pytest.raises(RuntimeError, match="Unsupported"):
        crossprocess.run(crossprocess.parse_args(argv))
