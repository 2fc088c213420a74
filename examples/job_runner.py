"""A task-group job runner: start it in as many processes (or hosts) as you like; every job of
the shared list is done once.

    python examples/job_runner.py results/ --jobs 50 &     # the embedded default
    python examples/job_runner.py results/ --jobs 50 &
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/job_runner.py results/ --jobs 50

Each process runs ``--tasks`` tasks in an :class:`asyncio.TaskGroup` over the list (every
process in its own random order).  For each job a task

1. tries the job's own lock, ``jobs:<job>`` (:meth:`~aiodlock.Lock.try_acquire`: one attempt,
   never a wait): held elsewhere, the job is skipped for now and the task moves on;
2. under the lock, looks for the job's completion record, ``RESULTS/<job>.json``: there, the
   job was done already (by anyone, in this run or an earlier one) and is skipped;
3. else does the job and writes its record, then releases the lock.

**The lock alone does not make a job run once**: it only keeps two workers from running it
at the same time.  A worker that finishes a job and releases, then another that takes the
lock a moment later, would run it again, hence the record, checked under the lock.  The
record is created atomically and only if absent (``os.link`` of a complete temporary file),
so even a worker whose lease was lost mid-job (a pause past the lease, see the fencing
example) cannot record a job twice; it says so (``duplicates``) instead.  In a database the
record is a row with a unique key, written in the job's own transaction.

Jobs skipped because they were busy get a second pass that *waits* for their lock: normally
the record is there by then; if the worker that held it died, its lease runs out
(``watchdog_ttl``) and this process does the job.  The process ends when every job has its
record and prints one JSON line: what it did, what it skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import tempfile
from pathlib import Path

import aiodlock


@dataclasses.dataclass
class Report:
    pid: int = dataclasses.field(default_factory=os.getpid)
    done: list[str] = dataclasses.field(default_factory=list)
    skipped_busy: int = 0  # held by somebody else at the first try
    already_done: int = 0  # the record was there when we held the lock
    duplicates: int = 0  # done by us, but recorded by somebody else first (a lost lease)


def record(results: Path, job: str, body: dict[str, object]) -> bool:
    """Create ``results/<job>.json`` with ``body`` if it does not exist; False if it did."""
    fd, tmp = tempfile.mkstemp(dir=results, prefix=f".{job}.")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(body, file)
        os.link(tmp, results / f"{job}.json")  # atomic, and fails if the record exists
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


async def do_job(job: str, seconds: float) -> str:
    """The work itself: here a sleep."""
    await asyncio.sleep(seconds)
    return f"{job} processed"


async def run_job(
    lock: aiodlock.Lock, lease: aiodlock.Lease, results: Path, report: Report, seconds: float
) -> None:
    """Do ``job`` unless its record exists (the caller holds its lock)."""
    job = lock.name.removeprefix("jobs:")
    try:
        if (results / f"{job}.json").exists():
            report.already_done += 1
            return
        result = await do_job(job, seconds)
        body = {"job": job, "result": result, "pid": report.pid, "token": lease.token}
        if record(results, job, body):
            report.done.append(job)
        else:
            report.duplicates += 1
    finally:
        with contextlib.suppress(aiodlock.LockLost):  # (the record says what happened)
            await lock.release()


async def run(
    client: aiodlock.Client, jobs: list[str], results: Path, tasks: int, seconds: float
) -> Report:
    report = Report()
    pending = random.sample(jobs, len(jobs))
    busy: list[str] = []

    async def first_pass() -> None:
        while pending:
            lock = client.lock(f"jobs:{pending.pop()}")
            lease = await lock.try_acquire()
            if lease is None:  # somebody else works on it now
                report.skipped_busy += 1
                busy.append(lock.name.removeprefix("jobs:"))
                continue
            await run_job(lock, lease, results, report, seconds)

    async def second_pass() -> None:
        while busy:
            lock = client.lock(f"jobs:{busy.pop()}")
            lease = await lock.acquire()  # wait for its holder to finish (or to die)
            await run_job(lock, lease, results, report, seconds)

    for one_pass in (first_pass, second_pass):
        async with asyncio.TaskGroup() as group:
            for _ in range(tasks):
                group.create_task(one_pass())
    return report


async def main() -> None:
    parser = argparse.ArgumentParser(description="Do every job once, with any number of us.")
    parser.add_argument("results", type=Path, help="folder of the jobs' completion records")
    parser.add_argument("--jobs", type=int, default=50, help="the jobs are job-0 ... job-N-1")
    parser.add_argument("--tasks", type=int, default=4, help="tasks in this process")
    parser.add_argument("--job-seconds", type=float, default=0.05, help="how long a job takes")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    jobs = [f"job-{n}" for n in range(args.jobs)]
    # connect() with no URL reads AIODLOCK_URL, else uses the embedded SQLite default.
    async with aiodlock.connect() as client:
        report = await run(client, jobs, args.results, args.tasks, args.job_seconds)
    print(json.dumps(dataclasses.asdict(report)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
