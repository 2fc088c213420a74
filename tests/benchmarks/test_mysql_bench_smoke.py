"""Smoke test of ``python -m benchmarks.mysql``: it runs and its report adds up."""

from __future__ import annotations

import pytest

from benchmarks import mysql

pytestmark = [pytest.mark.mysql, pytest.mark.slow]


def test_the_quick_run_reports_every_strategy_and_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert mysql.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for strategy in mysql.STRATEGIES:
        assert f"| {strategy} |" in out
    assert "20 served" in out
    assert out.count("| table's statements, raw |") == 2  # (one row per driver)
    for driver in ("aiomysql", "asyncmy"):  # (both by default): four targets each
        assert out.count(f"- {driver}: ") == 4, driver
    assert out.count(": PASS") + out.count(": FAIL") == 8
