"""Smoke test of ``python -m benchmarks.costs``: it runs against real servers and reports."""

from __future__ import annotations

import re

import pytest

from benchmarks import costs
from tests.conftest import require_server

pytestmark = pytest.mark.redis


def test_costs_reports_every_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    require_server("redis")
    assert costs.main(["--rounds", "1", "--cycles", "200"]) == 0
    out = capsys.readouterr().out
    for title in ("server: two requests", "transport: two requests", "redlock: one task"):
        assert title in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    numbers = [float(n) for row in rows for n in re.findall(r"\| (\d+\.\d)", row)]
    assert len(numbers) == 3 * 2 + 3 * 3 + 1 * 3  # every cell measured
    assert all(n >= 0 for n in numbers)
    assert any(n > 0 for n in numbers)
