"""``python -m benchmarks.suite``: every aiodlock backend and the peers a user would pick
instead, in ONE run, with a chart.

Runs each backend's own benchmark as a subprocess (each starts its throw-away servers
through the test harness, ``tests/servers.py``, on free loopback ports) and reads the JSON
it writes:

* A (uncontended cycles/s) and B (hand-off gap p50/p99) for aiodlock, its peers and its
  floor: ``benchmarks`` (Redis: redis-py, pottery, aioredlock, python-redis-lock, the floor),
  ``benchmarks.redlock`` (pottery, aioredlock), ``benchmarks.zookeeper`` (kazoo, aiozk),
  ``benchmarks.etcd`` (aetcd), ``benchmarks.mysql`` and ``benchmarks.postgres`` (the raw
  floors, a polling loop), ``benchmarks.sqlite`` (filelock, the raw floor), and the
  ``memory://`` backend (aiodlock alone);
* E: 4 OS processes x 2 tasks contending for one name on each server backend and SQLite
  (``benchmarks.crossprocess``): hand-off gap across processes, fairness.

    python -m benchmarks.suite              # about 5 minutes on 2 cores
    python -m benchmarks.suite --quick      # a smoke run, about 1 minute (numbers are noise)
    python -m benchmarks.suite --backends redis,etcd
    python -m benchmarks.suite --render benchmarks/results/suite.json   # redraw only

Writes ``benchmarks/results/<name>.json``, ``.md`` and ``.png`` (name ``suite``, or
``suite-quick``), and each step's own output and log under ``<name>-parts/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import suite_report
from .server import ROOT
from .side import RESULTS_DIR, csv_list, git_state, loadavg, machine

__all__ = ["BACKENDS", "E_BACKENDS", "Step", "main", "parse_args", "steps"]

BACKENDS = ("memory", "sqlite", "redis", "redlock", "zookeeper", "etcd", "mysql", "postgres")
E_BACKENDS = ("sqlite", "redis", "redlock", "zookeeper", "etcd", "mysql", "postgres")
REDIS_ADAPTERS = "aiodlock,floor,redis-py,pottery,aioredlock,python-redis-lock"


@dataclasses.dataclass
class Step:
    """One subprocess: ``python -m <args>``, whose results land in ``output`` (a path
    relative to the parts folder), read by ``read`` into rows (A/B) or an E row."""

    id: str
    backend: str
    workload: str  # "AB" or "E"
    args: list[str]
    output: str
    read: Callable[[dict[str, Any]], Any]

    def command(self, parts: Path) -> list[str]:
        return [sys.executable, "-m", *(a.replace("{parts}", str(parts)) for a in self.args)]


#: backend: (module, options, --quick's options, the default run's options).  The
#: benchmarks that write runner-style results get ``--name --out``, the others ``--json``.
AB = {
    "memory": ("benchmarks", "--adapters memory --workloads A,B", "--quick",
               "--a-rounds 40 --b-seconds 2 --b-repeats 2"),
    "sqlite": ("benchmarks.sqlite", "", "--quick", "--a-rounds 15"),
    "redis": ("benchmarks", f"--adapters {REDIS_ADAPTERS} --workloads A,B", "--quick",
              "--a-rounds 150 --b-seconds 3 --b-repeats 3"),
    "redlock": ("benchmarks.redlock", "--adapters aiodlock,pottery,aioredlock", "--quick",
                "--a-rounds 40 --b-seconds 5"),
    "zookeeper": ("benchmarks.zookeeper", "--force-sync no", "--quick --waiters 1 --releases 10",
                  "--a-rounds 30 --b-seconds 5 --waiters 1,10 --releases 100"),
    "etcd": ("benchmarks.etcd", "", "--quick", "--a-rounds 5 --a-seconds 1.5 --turns 300"),
    "mysql": ("benchmarks.mysql", "", "--quick", "--a-rounds 40 --rounds 100 --waiters 100"),
    "postgres": ("benchmarks.postgres", "", "--quick",
                 "--a-rounds 80 --b-cycles 200 --waiters 100"),
}  # fmt: skip
JSON_READERS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "etcd": suite_report.etcd_rows,
    "mysql": suite_report.mysql_rows,
    "postgres": suite_report.postgres_rows,
}
#: Roles the side benchmarks' results do not name (the runner's JSON has its own).
ROLES = {"sqlite": {"floor": "floor"}}


def _ab_step(backend: str, quick: bool) -> Step:
    module, options, quick_options, default_options = AB[backend]
    args = [module, *options.split(), *(quick_options if quick else default_options).split()]
    stem = f"{backend}-ab"
    if backend in JSON_READERS:
        args += ["--json", f"{{parts}}/{stem}.json"]
        read = JSON_READERS[backend]
    else:
        args += ["--name", stem, "--out", "{parts}"]
        roles = ROLES.get(backend, {})

        def read(doc: dict[str, Any]) -> list[dict[str, Any]]:
            return suite_report.side_rows(backend, doc, roles)

    return Step(f"{backend} A/B", backend, "AB", args, f"{stem}.json", read)


def _e_step(backend: str, acquisitions: int) -> Step:
    stem = f"{backend}-e"
    args = ["benchmarks.crossprocess", "--backend", backend, "--save", "--name", stem,
            "--out", "{parts}", "--processes", "4", "--tasks", "2",
            "--acquisitions", str(acquisitions), "--timeout", "120"]  # fmt: skip

    def read(doc: dict[str, Any]) -> dict[str, Any]:
        return suite_report.e_row(backend, doc)

    return Step(f"{backend} E", backend, "E", args, f"{stem}.json", read)


def steps(quick: bool, backends: list[str], acquisitions: int | None = None) -> list[Step]:
    """The steps of a run, in order: A/B per backend, then E per backend."""
    count = acquisitions or (25 if quick else 100)
    return [_ab_step(b, quick) for b in backends if b in AB] + [
        _e_step(b, count) for b in backends if b in E_BACKENDS
    ]


def _run_step(step: Step, parts: Path, timeout: float, status: Callable[[str], None]) -> str:
    """Run one step, its stdout and stderr into ``parts/<id>.log``; the last stderr line
    goes to ``status``.  Returns an error message, or '' when it wrote its output."""
    log_path = parts / f"{step.id.replace(' ', '-').replace('/', '')}.log"
    output = parts / step.output
    output.unlink(missing_ok=True)
    command = step.command(parts)
    with log_path.open("w") as log, subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:  # fmt: skip
        log.write(f"$ {shlex.join(command)}\n")
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if line.strip():
                    status(line.strip())
        finally:
            killer.cancel()
    if proc.returncode:
        how = "killed after the timeout" if proc.returncode < 0 else f"exit {proc.returncode}"
        return f"{how}; see {log_path}"
    if not output.exists():
        return f"wrote no {output.name}; see {log_path}"
    return ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every step, with a rich progress display on stderr; the results document."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    parts = args.out / f"{args.name}-parts"
    parts.mkdir(parents=True, exist_ok=True)
    plan = steps(args.quick, args.backends, args.acquisitions)
    doc: dict[str, Any] = {
        "meta": {
            "name": args.name,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": " ".join(["python -m benchmarks.suite", *map(shlex.quote, args.argv)]),
            "machine": machine(),
            "loadavg_before": loadavg(),
            "git": git_state(),
            "quick": args.quick,
        },
        "steps": [],
        "rows": [],
        "E": [],
    }
    console = Console(stderr=True, log_path=False)
    started = time.perf_counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn(
        "{task.completed}/{task.total}"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("[bold]benchmark suite", total=len(plan))
        current = progress.add_task("", total=None)
        for step in plan:
            progress.update(current, description=f"{step.id}: starting")
            t0 = time.perf_counter()

            def status(line: str, step: Step = step) -> None:
                progress.update(current, description=f"{step.id}: {line[:70]}")

            error = _run_step(step, parts, args.timeout, status)
            took = round(time.perf_counter() - t0, 1)
            record = {"id": step.id, "backend": step.backend, "workload": step.workload,
                      "command": shlex.join(step.command(parts)), "seconds": took,
                      "error": error}  # fmt: skip
            if not error:
                try:
                    found = step.read(json.loads((parts / step.output).read_text()))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    record["error"] = error = f"could not read {step.output}: {exc!r}"
                else:
                    if step.workload == "E":
                        doc["E"].append(found)
                    else:
                        doc["rows"].extend(found)
            doc["steps"].append(record)
            mark = "[red]FAILED[/red] " + error if error else "[green]done[/green]"
            progress.console.log(f"{step.id}: {mark} ({took} s){_brief(doc, step)}")
            progress.advance(overall)
        progress.update(current, visible=False)
    doc["meta"]["wall_seconds"] = round(time.perf_counter() - started, 1)
    doc["meta"]["loadavg_after"] = loadavg()
    return doc


def _brief(doc: dict[str, Any], step: Step) -> str:
    if step.workload == "E":
        e = next((e for e in doc["E"] if e["backend"] == step.backend), None)
        if e is None:
            return ""
        return (f": gap p50/p99 {e['handoff_p50_ms']}/{e['handoff_p99_ms']} ms, "
                f"fairness {e['share_min_max_ratio']}")  # fmt: skip
    rows = [r for r in doc["rows"] if r["backend"] == step.backend and r["cycles_per_s"]]
    return ": " + ", ".join(f"{r['name']} {r['cycles_per_s']:,.0f}/s" for r in rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a smoke run (numbers are noise)")
    p.add_argument("--backends", type=csv_list, default=list(BACKENDS),
                   help=f"comma-separated, from {','.join(BACKENDS)} (default: all)")  # fmt: skip
    p.add_argument("--acquisitions", type=int, help="E: per task (100; quick 25)")
    p.add_argument("--timeout", type=float, help="seconds before a step is killed (300; quick 90)")
    p.add_argument("--name", help="results file stem (suite, or suite-quick)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    p.add_argument("--render", type=Path, metavar="JSON",
                   help="only redraw the markdown and the chart of a saved run")  # fmt: skip
    args = p.parse_args(argv)
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    args.name = args.name or ("suite-quick" if args.quick else "suite")
    if args.timeout is None:
        args.timeout = 90.0 if args.quick else 300.0
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        doc = json.loads(args.render.read_text())
        paths = suite_report.write(doc, args.out, args.render.stem)
    else:
        doc = run(args)
        paths = suite_report.write(doc, args.out, args.name)
    print(suite_report.markdown(doc))
    print("wrote " + ", ".join(map(str, paths)))
    return 1 if any(s.get("error") for s in doc["steps"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
