"""examples/job_runner.py end to end: 3 processes share 50 jobs, every job is done once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import HANG

from .conftest import RunExample

pytestmark = pytest.mark.slow  # (4 Python processes: about 2 s per backend)

JOBS = 50


async def run_runners(run_example: RunExample, results: Path, processes: int) -> list[Any]:
    """``processes`` job runners at once, each to its end; their reports."""
    args = (str(results), "--jobs", str(JOBS), "--tasks", "2", "--job-seconds", "0.02")
    procs = [await run_example("job_runner.py", *args) for _ in range(processes)]
    reports = []
    async with asyncio.timeout(HANG * 2):
        for proc in procs:
            out, _ = await proc.communicate()
            text = out.decode(errors="replace")
            assert proc.returncode == 0, text[-3000:]
            reports.append(json.loads(text.strip().splitlines()[-1]))
    return reports


async def test_three_processes_do_every_job_exactly_once(
    run_example: RunExample, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    reports = await run_runners(run_example, results, 3)

    everything = {f"job-{n}" for n in range(JOBS)}
    done = [job for report in reports for job in report["done"]]
    assert sorted(done) == sorted(everything), "every job done by exactly one process"
    assert all(report["duplicates"] == 0 for report in reports)
    # The work was shared: the processes met (a busy lock, or a job another had finished).
    assert len({r["pid"] for r in reports if r["done"]}) >= 2, reports
    assert sum(r["skipped_busy"] + r["already_done"] for r in reports) > 0, reports

    # The records agree with what each process says it did; tokens are one per job's lock.
    records = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    assert set(records) == everything
    assert not list(results.glob(".*")), "no temporary record left behind"
    for report in reports:
        for job in report["done"]:
            assert records[job]["pid"] == report["pid"]
            assert records[job]["result"] == f"{job} processed"

    # "Once" comes from the records, not the lock: a later run finds every job done.
    (again,) = await run_runners(run_example, results, 1)
    assert again["done"] == []
    assert again["already_done"] == JOBS
