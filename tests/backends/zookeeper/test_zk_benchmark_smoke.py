"""Smoke test of ``python -m benchmarks.zookeeper``: it runs, measures and reports.

Nothing is timed: the assertions are about counts and structure, never speed.
"""

from __future__ import annotations

import pytest

from benchmarks import zookeeper as bench
from tests.servers import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


async def test_zookeeper_benchmark_runs(zookeeper_server: ZooKeeperServer) -> None:
    args = bench.parse_args(
        ["--quick", "--adapters", "aiodlock,aiozk,kazoo", "--waiters", "1,3", "--releases", "12"]
    )
    args.a_seconds, args.a_rounds, args.b_seconds, args.b_workers = 0.05, 3, 0.5, 3
    results = await bench.run(args, zookeeper_server.url, zookeeper_server.address)
    ran = [name for name in ("aiodlock", "aiozk", "kazoo") if name not in results["skipped"]]
    assert "aiodlock" in ran
    assert "aiozk" in ran
    for name in ran:
        assert results["A"][name]["cycles"] > 0, results["A"][name]
        contention = results["B"][name]
        assert "error" not in contention, contention
        assert contention["violations"] == 0
        assert contention["overlapping_intervals"] == 0
    assert results["B"]["aiodlock"]["acquisitions"] > 0
    assert results["A"]["aiodlock"]["ratio_to_better_peer"] > 0
    rows = results["wakeups"]
    assert [row["waiters"] for row in rows] == [1, 3]
    for row in rows:
        assert row["violations"] == 0
        assert row["releases"] >= 12
        assert row["wakeups_per_handoff"] <= 1.0  # never more than one waiter woken
        assert row["relistings_per_handoff"] <= 1.0
    doc = {"meta": _meta(), "results": results, "targets": bench.targets(results)}
    text = bench.markdown(doc)
    assert "| aiodlock |" in text
    assert "Targets:" in text


def _meta() -> dict[str, object]:
    return {
        "name": "smoke",
        "date": "now",
        "command": "pytest",
        "machine": "here",
        "loadavg_before": "0",
        "loadavg_after": "0",
        "server": "zookeeper",
        "versions": {"python": "3"},
    }
