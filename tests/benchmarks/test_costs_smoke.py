"""Smoke test of ``python -m benchmarks.costs``: it runs against real servers and reports."""

from __future__ import annotations

import os
import re

import pytest

from benchmarks import costs
from tests.conftest import require_server

pytestmark = pytest.mark.redis


def test_costs_reports_every_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    require_server("redis")
    cpus = os.sched_getaffinity(0)
    assert costs.main(["--rounds", "1", "--cycles", "200"]) == 0
    out = capsys.readouterr().out
    titles = ("server: two requests", "transport: two requests", "redlock: one task", "placement:")
    for title in titles:
        assert title in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    numbers = [float(n) for row in rows for n in re.findall(r"\| (\d+\.\d+)x?(?= \|)", row)]
    placements = 3 if len(os.sched_getaffinity(0)) >= 2 else 1
    # every cell measured: server, transport, redlock, placement (2 adapters per placement,
    # 3 columns), and the ratio per placement
    assert len(numbers) == 3 * 2 + 3 * 3 + 1 * 3 + placements * 2 * 3 + placements
    assert all(n >= 0 for n in numbers)
    assert any(n > 0 for n in numbers)
    # the placement runs pin this process; it gets its CPUs back
    assert os.sched_getaffinity(0) == cpus


def test_costs_rejects_an_unknown_table() -> None:
    with pytest.raises(SystemExit):
        costs.main(["--tables", "server,nope"])
