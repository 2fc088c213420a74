"""Smoke test of ``python -m benchmarks.redlock``: it runs, measures and reports.

Nothing is timed: the assertions are about counts and structure, never speed.  The peers
(pottery, aioredlock) are left out: under the suite's ``filterwarnings = error`` their
dependencies' deprecation warnings become errors inside their own callbacks.
"""

from __future__ import annotations

import pytest

from benchmarks import redlock as bench
from tests.servers import RedisGroup

pytestmark = [pytest.mark.redis, pytest.mark.slow]


async def test_redlock_benchmark_runs(five: RedisGroup) -> None:
    args = bench.parse_args(["--quick", "--adapters", "aiodlock,aiodlock-sequential"])
    args.a_seconds, args.a_rounds, args.b_seconds, args.b_settle, args.b_workers = (
        0.03,
        2,
        0.3,
        0.05,
        3,
    )
    results = await bench.run(args, "redlock://" + five.hosts)
    ran = [name for name in args.adapters if name not in results["skipped"]]
    assert {"aiodlock", "aiodlock-sequential"} <= set(ran)
    for name in ran:
        assert results["A"][name]["cycles"] > 0, results["A"][name]
        contention = results["B"][name]
        assert "error" not in contention, contention
        assert contention["violations"] == 0
        assert contention["overlapping_intervals"] == 0
    assert results["A_ratios"]["aiodlock_vs_sequential"] > 0
    doc = {
        "meta": {
            "name": "smoke",
            "date": "now",
            "command": "pytest",
            "machine": "test",
            "loadavg_before": "",
            "loadavg_after": "",
            "server": "5 x redis",
            "versions": {},
        },
        "results": results,
        "targets": bench.targets(results),
    }
    text = bench.markdown(doc)
    assert "| aiodlock |" in text
    assert "| aiodlock-sequential |" in text
    assert "Targets:" in text
