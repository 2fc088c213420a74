"""Throw-away servers on free loopback ports, through the test harness (``tests/servers.py``).

A redis-server, ``n`` independent Redis masters (Redlock) or a standalone ZooKeeper; never
the system's servers on their standard ports: the ports come from ``tests.servers.free_port()``.
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

__all__ = [
    "etcd_server",
    "log",
    "mariadb_server",
    "redis_masters",
    "redis_server",
    "servers_module",
    "temporary_server",
    "zookeeper_server",
]

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
def temporary_server(
    kind: str, make: Callable[[Any, Path], Any], prefix: str, parent: str | None = None
) -> Iterator[Any]:
    """Start ``make(servers_module, base_dir)`` (a harness server or group of ``kind``), yield
    it, then stop it and delete its files (``base_dir`` in ``parent``, default: the temp dir)."""
    servers = servers_module()
    missing = servers.binary_missing(kind)
    if missing:
        raise RuntimeError(missing)
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
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


def redis_masters(n: int) -> contextlib.AbstractContextManager[Any]:
    """``n`` throw-away redis-servers (independent masters), stopped and deleted after."""
    return temporary_server(
        "redis", lambda servers, base: servers.RedisGroup(base, n), "aiodlock-bench-redlock-"
    )


def zookeeper_server(force_sync: bool) -> contextlib.AbstractContextManager[Any]:
    """A throw-away standalone ZooKeeper (``forceSync=no`` unless ``force_sync``)."""
    extra = {} if force_sync else {"forceSync": "no"}
    return temporary_server(
        "zookeeper",
        lambda servers, base: servers.ZooKeeperServer(base, extra_config=extra),
        "aiodlock-bench-zk-",
    )


def etcd_server(tmpfs: bool) -> contextlib.AbstractContextManager[Any]:
    """A throw-away single etcd member (the tests' fast raft timings); ``tmpfs``: its data on
    /dev/shm, where an fsync costs nothing (etcd 3.4 has no switch to turn fsync off)."""
    parent = "/dev/shm" if tmpfs and Path("/dev/shm").is_dir() else None
    return temporary_server(
        "etcd", lambda servers, base: servers.EtcdServer(base), "aiodlock-bench-etcd-", parent
    )


def mariadb_server() -> contextlib.AbstractContextManager[Any]:
    """A throw-away MariaDB (a fresh datadir, root without password, database aiodlock_test)."""
    return temporary_server(
        "mysql", lambda servers, base: servers.MariaDBServer(base), "aiodlock-bench-mysql-"
    )


def log(message: str) -> None:
    """A progress line on stderr."""
    print(message, file=sys.stderr, flush=True)
