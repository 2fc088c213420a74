"""A fresh redis-server on a free loopback port, through the test harness's RedisServer.

Never the system Redis on 6379: the port comes from ``tests.servers.free_port()``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["log", "redis_server", "servers_module", "temporary_server"]

ROOT = Path(__file__).resolve().parents[1]


def servers_module() -> ModuleType:
    """``tests/servers.py`` of this checkout (imported as ``tests.servers`` when possible)."""
    path = ROOT / "tests" / "servers.py"
    try:
        import tests.servers as module
    except ImportError:
        module = None  # type: ignore[assignment]
    if module is not None and Path(module.__file__ or "").resolve() == path:
        return module
    # Some other ``tests`` package is first on sys.path: load the file directly.
    name = "_aiodlock_bench_servers"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # dataclasses look their module up while the class is built
    spec.loader.exec_module(loaded)
    return loaded


@contextlib.contextmanager
def temporary_server(kind: str, make: Callable[[Any, Path], Any], prefix: str) -> Iterator[Any]:
    """Start ``make(servers_module, base_dir)`` (a harness server or group of ``kind``), yield
    it, then stop it and delete its files."""
    servers = servers_module()
    missing = servers.binary_missing(kind)
    if missing:
        raise RuntimeError(missing)
    base = Path(tempfile.mkdtemp(prefix=prefix))
    server = make(servers, base)
    try:
        server.start()
        yield server
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)


def redis_server() -> contextlib.AbstractContextManager[Any]:
    """Start a throw-away redis-server (no persistence); stop it and delete its files."""
    return temporary_server(
        "redis", lambda servers, base: servers.RedisServer(base), "aiodlock-bench-"
    )


def log(message: str) -> None:
    """A progress line on stderr."""
    print(message, file=sys.stderr, flush=True)
