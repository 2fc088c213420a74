"""Smoke test of ``python -m benchmarks.etcd --quick``: it runs against a real member and
judges its targets.  Nothing is timed: the assertions are about what it reports."""

from __future__ import annotations

import pytest

from benchmarks import etcd
from tests.conftest import require_server

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def test_quick_run_reports_the_targets(capsys: pytest.CaptureFixture[str]) -> None:
    require_server("etcd")
    assert etcd.main(["--quick"]) == 0
    captured = capsys.readouterr()
    assert "PASS  1.0 wake-up per hand-off, 1..100 waiters" in captured.out
    assert "PASS  no missed wake-up" in captured.out
    assert "A aiodlock" in captured.err
