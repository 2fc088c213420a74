"""Smoke test of ``python -m benchmarks.postgres --quick``: it runs against a throw-away
PostgreSQL and reports every target.  Nothing is timed: the assertions are about what it
reports (the quick run's numbers are noise)."""

from __future__ import annotations

import pytest

from benchmarks import postgres
from tests.conftest import require_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_the_quick_run_reports_every_target(capsys: pytest.CaptureFixture[str]) -> None:
    require_server("postgres")
    postgres.main(["--quick"])
    out = capsys.readouterr().out
    for target in (
        "A: uncontended >= 0.8x the floor",
        "B: hand-off gap p50 < 2 ms",
        "B: hand-off gap p99 < 10 ms",
        "W: wake-ups per hand-off 1.0 (20 waiters)",
    ):
        assert f"  {target}: " in out, target
    assert "PASS  W: wake-ups per hand-off 1.0 (20 waiters): 1" in out  # (counted, not timed)
    assert "raw bound (" in out
    assert "strategy=table (no target)" in out
