"""The capability table of docs/backends/index.md says what the backends declare."""

from __future__ import annotations

import importlib
from pathlib import Path

import aiodlock
from aiodlock._registry import BUILTIN
from aiodlock._types import Capability

PAGE = Path(__file__).resolve().parents[2] / "docs" / "backends" / "index.md"

#: A row of the table -> a URL that makes that backend (connect() does no I/O).
URLS = {
    "memory": "memory://",
    "SQLite": "sqlite:///locks.db",
    "Redis": "redis://127.0.0.1:6379/0",
    "Redlock": "redlock://127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382",
    "ZooKeeper": "zookeeper://127.0.0.1:2181",
    "etcd": "etcd://127.0.0.1:2379",
    "PostgreSQL `advisory`": "postgresql://postgres@127.0.0.1:5432/aiodlock",
    "PostgreSQL `table`": "postgresql://postgres@127.0.0.1:5432/aiodlock?strategy=table",
    "MySQL `table`": "mysql://root@127.0.0.1:3306/aiodlock?strategy=table",
    "MySQL `named`": "mysql://root@127.0.0.1:3306/aiodlock?strategy=named",
    "MySQL `row`": "mysql://root@127.0.0.1:3306/aiodlock?strategy=row",
}


def capability_rows() -> dict[str, dict[str, str]]:
    """The table under "## Capabilities": backend -> {column: cell}."""
    section = PAGE.read_text().split("## Capabilities", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def test_the_table_matches_each_backends_capability_flags() -> None:
    rows = capability_rows()
    assert set(rows) == set(URLS)
    for backend, row in rows.items():
        flags = aiodlock.connect(URLS[backend]).backend.capabilities
        assert row["`fair=True`"] == yes(Capability.FAIR in flags), backend
        assert row["always FIFO"] == yes(Capability.ALWAYS_FAIR in flags), backend
        assert row["fencing token"] == yes(Capability.FENCING in flags), backend
        lease = "session" if Capability.SESSION_LEASE in flags else "watchdog"
        assert row["lease"] == lease, backend
        assert (row["shared by"] == "one process") == (Capability.CROSS_PROCESS not in flags)
        assert row["reentrant"] == "yes", backend  # the core's, for every backend


def test_every_builtin_backend_has_a_row() -> None:
    shown = {type(aiodlock.connect(url).backend) for url in URLS.values()}
    for target in set(BUILTIN.values()):
        module, _, name = target.partition(":")
        assert getattr(importlib.import_module(module), name) in shown, target
