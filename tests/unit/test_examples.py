"""The scripts in examples/ run as documented."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: apps and services (they run until stopped, or take arguments): tests/examples/ runs each
#: end to end, as several processes on SQLite and on Redis
END_TO_END = {"fastapi_app", "aiohttp_app", "job_runner", "leader"}
EXAMPLES = [
    path
    for path in sorted((Path(__file__).parents[2] / "examples").glob("*.py"))
    if path.stem not in END_TO_END
]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("AIODLOCK_URL", None)
    env["XDG_CACHE_HOME"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
