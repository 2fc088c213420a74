"""Smoke tests of the benchmark runner (benchmarks/): it runs, measures and reports.

Nothing here is timed: durations are a fraction of a second and the assertions are about
counts and structure (mutual exclusion, FIFO order of the memory backend), never speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import runner
from benchmarks.report import markdown
from tests.servers import RedisServer


def tiny(**overrides: object) -> runner.Config:
    cfg = runner.Config(
        name="smoke",
        a_seconds=0.05,
        a_rounds=1,
        b_seconds=0.2,
        b_repeats=2,
        b_settle=0.05,
        b_workers=4,
        c_seconds=0.05,
        c_rounds=1,
        c_tasks=4,
        traffic_waiters=[2, 3],
        traffic_releases=10,
        drain_timeout=10.0,
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


async def test_memory_adapter_runs_every_workload(tmp_path: Path) -> None:
    cfg = tiny(adapters=["memory"], out=tmp_path)
    results = await runner.run_suite(cfg, None)

    assert results["adapters_run"] == ["memory"]
    assert results["A"]["memory"]["cycles"] > 0
    assert results["C"]["memory"]["cycles"] > 0
    for workload in ("B", "B-fair"):
        row = results[workload]["memory"]
        assert "error" not in row, row
        assert row["repeats"] == 2
        # Waits that end after the window are measured too (the run drains): a wait was
        # measured even if a stalled machine let nobody in during the window.
        assert row["wait"]["n"] >= 1
        assert row["wait"]["n"] >= row["acquisitions"]
        assert row["violations"] == 0
        assert row["overlapping_intervals"] == 0
        assert not row["aborted"]
        assert row["errors"] == []
        # memory:// hands a released lock to the oldest waiter: nobody takes it back while
        # others wait, and the workers take strict turns (in every repeat).
        assert row["same_owner_share"] in (0.0, None)
        for run in row["runs"]:
            assert run["per_worker_max"] - run["per_worker_min"] <= 1
            assert run["owner_changes"] == max(run["acquisitions"] - 1, 0)
        assert row["acquisitions"] == sum(run["acquisitions"] for run in row["runs"])
    statuses = {t["id"]: t["status"] for t in results["targets"]}
    assert statuses["exclusion"] == "PASS"
    assert statuses["A-floor"] == "N/A"  # no floor without a server
    assert set(statuses.values()) <= {"PASS", "FAIL", "N/A"}
    assert "traffic" not in results  # needs a Redis server

    json_path, md_path = runner.write(results, tmp_path, "smoke")
    assert json.loads(json_path.read_text())["meta"]["name"] == "smoke"
    text = md_path.read_text()
    assert "### Targets" in text
    assert "| memory |" in text
    assert markdown(results, results["targets"]) == text


@pytest.mark.redis
async def test_floor_against_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    cfg = tiny(adapters=["floor"], workloads=["A", "B", "C"], out=tmp_path)
    results = await runner.run_suite(cfg, redis_server.url, flush=False)

    assert results["skipped"] == {}
    assert results["A"]["floor"]["cycles"] > 0, results["A"]
    assert results["C"]["floor"]["cycles"] > 0, results["C"]
    assert results["B"] == {}  # the floor does not wait, so it sits out contention
    assert "redis-server" in results["meta"]["server"]


def test_command_line_refuses_the_system_redis() -> None:
    with pytest.raises(SystemExit):
        runner.parse_args(["--url", "redis://127.0.0.1:6379/0"])
    with pytest.raises(SystemExit):
        runner.parse_args(["--adapters", "nope"])
    cfg, _ = runner.parse_args(["--quick", "--adapters", "memory", "--b-seconds", "0.1"])
    assert cfg.quick
    assert cfg.name == "quick"
    assert cfg.adapters == ["memory"]
    assert cfg.b_seconds == 0.1
