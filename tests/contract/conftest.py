"""The contract suite: one set of tests that every backend must pass.

Each backend is a parameter of the ``backend`` fixture; a backend whose module does not
exist yet is left out, and one whose server is missing skips locally and fails in CI (the
server fixtures in ``tests/conftest.py`` decide that).
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import pytest

import aiodlock
from tests.helpers import ClientFactory

#: backend -> (module, marks)
BACKENDS: dict[str, tuple[str, tuple[pytest.MarkDecorator, ...]]] = {
    "memory": ("aiodlock.backends.memory", ()),
    "sqlite": ("aiodlock.backends.sqlite", ()),
    "redis": ("aiodlock.backends.redis", (pytest.mark.redis,)),
    # (deployment variants of redis: the whole suite runs them, the fast one does not)
    "redis-sentinel": ("aiodlock.backends.redis", (pytest.mark.redis, pytest.mark.slow)),
    "redis-cluster": ("aiodlock.backends.redis", (pytest.mark.redis, pytest.mark.slow)),
    "redlock": ("aiodlock.backends.redis", (pytest.mark.redis,)),
    "zookeeper": ("aiodlock.backends.zookeeper", (pytest.mark.zookeeper,)),
    # (about 20 s each: the fast suite runs tests/backends/<name>, the whole suite the contract)
    "etcd": ("aiodlock.backends.etcd", (pytest.mark.etcd, pytest.mark.slow)),
    "mysql": ("aiodlock.backends.mysql", (pytest.mark.mysql, pytest.mark.slow)),
    "mysql-named": ("aiodlock.backends.mysql", (pytest.mark.mysql, pytest.mark.slow)),
    "mysql-row": ("aiodlock.backends.mysql", (pytest.mark.mysql, pytest.mark.slow)),
    # (the table through the other driver: its own dependency, checked below)
    "mysql-asyncmy": ("aiodlock.backends.mysql", (pytest.mark.mysql, pytest.mark.slow)),
    "postgres": ("aiodlock.backends.postgres", (pytest.mark.postgres, pytest.mark.slow)),
    "postgres-table": ("aiodlock.backends.postgres", (pytest.mark.postgres, pytest.mark.slow)),
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


#: backend -> a driver it needs besides its module's own
EXTRA_MODULES = {"mysql-asyncmy": "asyncmy"}

PARAMS = [
    pytest.param(name, marks=marks, id=name)
    for name, (module, marks) in BACKENDS.items()
    if _present(module) and _present(EXTRA_MODULES.get(name, module))
]
#: Redis Sentinel and Cluster: tests that need many runs to show a race run on them only
REDIS_DEPLOYMENTS = [p for p in PARAMS if p.id in ("redis-sentinel", "redis-cluster")]


@pytest.fixture(params=PARAMS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for the backend under test (servers are shared; namespaces isolate tests)."""
    if backend == "memory":
        return f"memory://contract-{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'locks.db'}"
    if backend == "redis":
        return str(request.getfixturevalue("redis_server").url)
    if backend == "redis-sentinel":
        return str(request.getfixturevalue("sentinel_deployment").url)
    if backend == "redis-cluster":
        return str(request.getfixturevalue("cluster_deployment").url)
    if backend == "redlock":
        servers = request.getfixturevalue("redlock_servers")
        return "redlock://" + ",".join(f"127.0.0.1:{s.port}" for s in servers)
    if backend == "zookeeper":
        return str(request.getfixturevalue("zookeeper_server").url)
    if backend == "etcd":
        return str(request.getfixturevalue("etcd_server").url)
    if backend == "mysql":
        return str(request.getfixturevalue("mariadb_server").url)
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_server").url)
    if backend == "postgres-table":
        return str(request.getfixturevalue("postgres_server").url) + "?strategy=table"
    if backend == "mysql-named":
        return str(request.getfixturevalue("mariadb_server").url) + "?strategy=named"
    if backend == "mysql-row":
        return str(request.getfixturevalue("mariadb_server").url) + "?strategy=row"
    if backend == "mysql-asyncmy":
        return str(request.getfixturevalue("mariadb_server").url) + "?driver=asyncmy"
    raise AssertionError(backend)


@pytest.fixture
def lock_url(backend_url: str) -> str:
    return backend_url


@pytest.fixture
async def other(make_client: ClientFactory) -> aiodlock.Client:
    """A second client of the same backend and namespace: another process, in effect."""
    return await make_client()
