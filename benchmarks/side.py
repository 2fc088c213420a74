"""What every benchmark run records and the side benchmarks share: the results folder, the
machine, load and versions a run ran on, the saved JSON and markdown, and the command line of
``python -m benchmarks.<backend>`` (:class:`SideBenchmark`)."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "SideBenchmark",
    "csv_list",
    "git_state",
    "loadavg",
    "machine",
    "package_versions",
    "save_run",
    "side_report_head",
    "side_rows",
    "target_lines",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f", {int(line.split()[1]) // 1024 // 1024 + 1} GiB RAM"
                break
    except (OSError, ValueError):
        pass
    return (
        f"{os.cpu_count()} CPUs ({model}){memory}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()} ({platform.python_implementation()})"
    )


def git_state() -> str:
    """The checkout's commit, and whether aiodlock/ has uncommitted changes."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        run = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
        return run.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "aiodlock")
    except (OSError, subprocess.SubprocessError):
        return "n/a"
    return f"{head}{' + uncommitted changes in aiodlock/' if dirty else ''}" if head else "n/a"


def csv_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def package_versions(*packages: str) -> dict[str, str]:
    """Installed versions of ``packages`` (and Python), for the results' metadata."""
    versions = {"python": platform.python_version()}
    for package in packages:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def save_run(
    *,
    out: Path,
    name: str,
    module: str,
    argv: Sequence[str] | None,
    server: str,
    packages: Sequence[str],
    loadavg_before: Any,
    results: Any,
    targets: Callable[[Any], Any],
    markdown: Callable[[dict[str, Any]], str],
) -> str:
    """Write ``<out>/<name>.json`` and ``.md`` for a side benchmark (ZooKeeper, Redlock)."""
    doc: dict[str, Any] = {
        "meta": {
            "name": name,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": " ".join([f"python -m {module}", *(argv or sys.argv[1:])]),
            "machine": machine(),
            "loadavg_before": loadavg_before,
            "loadavg_after": loadavg(),
            "server": server,
            "versions": package_versions(*packages),
            "git": git_state(),
        },
        "results": results,
    }
    doc["targets"] = targets(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = markdown(doc)
    (out / f"{name}.md").write_text(text)
    return text


def side_report_head(title: str, server_label: str, meta: dict[str, Any]) -> list[str]:
    """The first lines of a side benchmark's markdown report (what ran, where, with what)."""
    return [
        f"# {title} benchmark `{meta['name']}`",
        "",
        f"- {meta['date']}, `{meta['command']}`",
        f"- {meta['machine']}; load average before/after {meta['loadavg_before']} / "
        f"{meta['loadavg_after']}",
        f"- {server_label}: {meta['server']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        "",
    ]


#: The options of the side benchmarks that take their defaults from the module (each one that
#: the module's ``defaults`` name) and their help (``{}``: the defaults, plain and quick).
_SIDE_OPTIONS: dict[str, tuple[type, str]] = {
    "a_seconds": (float, "length of one A slice ({})"),
    "a_rounds": (int, "A rounds, one slice per adapter ({})"),
    "b_seconds": (float, "measured window of B ({})"),
    "b_settle": (float, "unmeasured start of B ({})"),
}


class SideBenchmark:
    """The command line of a side benchmark (``python -m benchmarks.<stem>``): the options
    they all have, a module's own added to :attr:`parser`, and :meth:`parse` fills what was
    left unset from ``defaults`` (updated by ``quick`` under ``--quick``)."""

    def __init__(
        self,
        stem: str,
        doc: str | None,
        adapters: Iterable[str],
        defaults: dict[str, Any],
        quick: dict[str, Any],
    ) -> None:
        self.stem, self.adapters = stem, list(adapters)
        self.defaults, self.quick = defaults, quick
        p = argparse.ArgumentParser(prog=f"python -m benchmarks.{stem}", description=doc)
        p.add_argument("--name", default=None)
        p.add_argument("--quick", action="store_true")
        p.add_argument("--adapters", type=csv_list, default=self.adapters)
        for key, (kind, text) in _SIDE_OPTIONS.items():
            if key in defaults:
                option, shown = f"--{key.replace('_', '-')}", self.shown(key)
                p.add_argument(option, type=kind, help=text.format(shown))
        p.add_argument("--b-workers", type=int, default=8)
        p.add_argument("--out", type=Path, default=RESULTS_DIR)
        self.parser = p

    def shown(self, key: str) -> str:
        """``key``'s defaults as a help text shows them: ``"0.2; quick 0.1"``."""

        def text(value: Any) -> str:
            return ",".join(map(str, value)) if isinstance(value, list) else str(value)

        plain = self.defaults[key]
        return f"{text(plain)}; quick {text(self.quick.get(key, plain))}"

    def parse(self, argv: list[str] | None) -> argparse.Namespace:
        """The options; the adapters asked for are checked and the run named ``stem`` (or
        ``stem-quick``)."""
        args = self.parser.parse_args(argv)
        for key, value in {**self.defaults, **(self.quick if args.quick else {})}.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        unknown = [a for a in args.adapters if a not in self.adapters]
        if unknown:
            known = ", ".join(self.adapters)
            self.parser.error(f"unknown adapter(s) {', '.join(unknown)}; known: {known}")
        args.name = args.name or (f"{self.stem}-quick" if args.quick else self.stem)
        return args


def side_rows(
    results: dict[str, Any], names: Iterable[str]
) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(adapter, A result, B result)`` for each adapter of a side benchmark that ran (an
    adapter that was not run in a workload gets an empty dict there)."""
    for name in names:
        a, b = results["A"].get(name), results["B"].get(name)
        if a is None and b is None:
            continue
        yield name, a or {}, b or {}


def target_lines(doc: dict[str, Any]) -> list[str]:
    """``- [PASS] goal: measured`` for each judged target of a side benchmark."""
    return [f"- [{t['status']}] {t['goal']}: {t['measured']}" for t in doc["targets"]]
