"""examples/job_runner.py end to end: 3 processes share 50 jobs, every job is done once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import aiodlock
from tests.helpers import HANG, eventually

from .conftest import RunExample

pytestmark = pytest.mark.slow  # (4 Python processes: about 2 s per backend)

JOBS = 50


def runner_args(
    results: Path, jobs: int = JOBS, tasks: int = 2, seconds: float = 0.02
) -> list[str]:
    return [str(results), "--jobs", str(jobs), "--tasks", str(tasks), "--job-seconds", str(seconds)]


async def report_of(proc: asyncio.subprocess.Process) -> Any:
    """The runner's report, once it has ended (successfully)."""
    async with asyncio.timeout(HANG * 2):
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return json.loads(text.strip().splitlines()[-1])


async def run_runners(run_example: RunExample, results: Path, processes: int) -> list[Any]:
    """``processes`` job runners at once, each to its end; their reports."""
    procs = [await run_example("job_runner.py", *runner_args(results)) for _ in range(processes)]
    return [await report_of(proc) for proc in procs]


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


async def test_the_jobs_of_a_dead_worker_are_done_once_its_leases_run_out(
    run_example: RunExample, example_url: str, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    # (the leases outlive the first worker by 2 s at least: time for the next one to start)
    ttl = "&watchdog_ttl=3"
    # A worker takes all three jobs and dies in the middle of them.
    args = runner_args(results, jobs=3, tasks=3, seconds=60)
    dead = await run_example("job_runner.py", *args, query=ttl)
    async with aiodlock.connect(example_url) as client:

        async def all_taken() -> bool:
            taken = [await client.lock(f"jobs:job-{n}").status() for n in range(3)]
            return all(status is not None for status in taken)

        await eventually(all_taken, what="the first worker holds its jobs")
    dead.kill()
    await dead.wait()
    # The next one finds them busy, waits for their leases to run out, and does them.
    report = await report_of(
        await run_example("job_runner.py", *runner_args(results, jobs=3), query=ttl)
    )
    assert report["skipped_busy"] == 3
    assert sorted(report["done"]) == ["job-0", "job-1", "job-2"]
    assert {json.loads(p.read_text())["pid"] for p in results.glob("*.json")} == {report["pid"]}
