"""Real-server fixtures for the whole test-suite (no mocks; see tests/servers.py).

Shared, session-scoped servers (started lazily on first use, healed before and after every
test: resumed if a test left them paused, restarted on the same port if a test killed them)::

    redis_server, redlock_servers (3 Redis masters), zookeeper_server, etcd_server,
    mariadb_server, postgres_server, sentinel_deployment (a master, a replica, three sentinels),
    cluster_deployment (a three-master Redis Cluster; the deployments are not healed)

Private servers for fault tests (kill / pause / restart freely; all closed at teardown)::

    redis_factory(**kw) -> RedisServer           redis_many(n, **kw) -> RedisGroup
    zookeeper_factory(**kw) -> ZooKeeperServer   zookeeper_ensemble(size=3) -> ZooKeeperEnsemble
    etcd_factory(**kw) -> EtcdServer             etcd_cluster(size=3) -> EtcdCluster
    mariadb_factory(**kw) -> MariaDBServer      postgres_factory(**kw) -> PostgresServer
    sentinel_factory(**kw) -> SentinelDeployment cluster_factory() -> ClusterDeployment

All fixtures are synchronous so they work with any pytest-asyncio loop scope.  A missing server
binary skips the test, except when ``CI=true``: then it fails.
"""

from __future__ import annotations

import os

# gRPC (etcd's client) with its fork support on makes a child forked while its threads run
# abort between fork and exec now and then (11 of 60 here): every server is started with a
# preexec_fn (PR_SET_PDEATHSIG), so a fork.  Set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import aiodlock
from tests.helpers import ClientFactory, ServeFactory, open_clients, serving
from tests.servers import (
    ClusterDeployment,
    EtcdCluster,
    EtcdServer,
    MariaDBServer,
    PostgresServer,
    RedisGroup,
    RedisServer,
    SentinelDeployment,
    Server,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    binary_missing,
)

S = TypeVar("S", bound=Server)

#: shared servers already started in this session (healed around every test)
_SHARED: list[Server] = []


def require_server(kind: str) -> None:
    """Skip the test when the ``kind`` server cannot run here; fail instead when CI=true."""
    reason = binary_missing(kind)
    if reason is None:
        return
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{reason} [CI=true: a missing server is a failure]", pytrace=False)
    pytest.skip(reason)


def _heal_shared() -> None:
    for server in _SHARED:
        server.ensure_running()


@pytest.fixture(autouse=True)
def _shared_servers_healthy() -> Iterator[None]:
    """Resume/restart shared servers that an earlier test paused or killed."""
    _heal_shared()
    yield
    _heal_shared()


@pytest.fixture(scope="session")
def _servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


def _shared(server: S) -> Iterator[S]:
    server.start()
    _SHARED.append(server)
    try:
        yield server
    finally:
        _SHARED.remove(server)
        server.close()


# -- shared servers ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(_servers_dir: Path) -> Iterator[RedisServer]:
    require_server("redis")
    yield from _shared(RedisServer(_servers_dir))


@pytest.fixture(scope="session")
def redlock_servers(_servers_dir: Path) -> Iterator[RedisGroup]:
    """Three independent Redis masters shared by the session (Redlock)."""
    require_server("redis")
    group = RedisGroup(_servers_dir, 3).start()
    _SHARED.extend(group)
    try:
        yield group
    finally:
        for member in group:
            _SHARED.remove(member)
        group.close()


@pytest.fixture(scope="session")
def zookeeper_server(_servers_dir: Path) -> Iterator[ZooKeeperServer]:
    require_server("zookeeper")
    yield from _shared(ZooKeeperServer(_servers_dir))


@pytest.fixture(scope="session")
def etcd_server(_servers_dir: Path) -> Iterator[EtcdServer]:
    require_server("etcd")
    yield from _shared(EtcdServer(_servers_dir))


@pytest.fixture(scope="session")
def mariadb_server(_servers_dir: Path) -> Iterator[MariaDBServer]:
    require_server("mysql")
    yield from _shared(MariaDBServer(_servers_dir))


@pytest.fixture(scope="session")
def postgres_server(_servers_dir: Path) -> Iterator[PostgresServer]:
    require_server("postgres")
    yield from _shared(PostgresServer(_servers_dir))


@pytest.fixture(scope="session")
def sentinel_deployment(_servers_dir: Path) -> Iterator[SentinelDeployment]:
    """A master, a replica and three sentinels, shared by the tests that do not fail it over."""
    require_server("redis")
    deployment = SentinelDeployment(_servers_dir / "sentinel").start()
    yield deployment
    deployment.close()


@pytest.fixture(scope="session")
def cluster_deployment(_servers_dir: Path) -> Iterator[ClusterDeployment]:
    """A three-master Redis Cluster, shared by the tests that do not fail it over or reshard."""
    require_server("redis")
    deployment = ClusterDeployment(_servers_dir / "cluster").start()
    yield deployment
    deployment.close()


# -- private servers for fault tests -----------------------------------------------------------


class _Factory:
    """Starts servers on demand and closes all of them at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.closers: list[Callable[[], None]] = []

    def add(self, closer: Callable[[], None]) -> None:
        self.closers.append(closer)

    def close(self) -> None:
        errors: list[BaseException] = []
        for closer in reversed(self.closers):
            try:
                closer()
            except Exception as exc:  # close everything, report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def _factory(tmp_path: Path) -> Iterator[_Factory]:
    factory = _Factory(tmp_path)
    yield factory
    factory.close()


def _server_factory(factory: _Factory, cls: type[S]) -> Callable[..., S]:
    def start(**kwargs: Any) -> S:
        server = cls(factory.base, **kwargs)
        factory.add(server.close)
        return server.start()

    return start


@pytest.fixture
def redis_factory(_factory: _Factory) -> Callable[..., RedisServer]:
    """``redis_factory(port=None, password=None, extra_args=(), config_text=None)``."""
    require_server("redis")
    return _server_factory(_factory, RedisServer)


@pytest.fixture
def zookeeper_factory(_factory: _Factory) -> Callable[..., ZooKeeperServer]:
    """``zookeeper_factory(port=None, extra_config=None)``: a standalone ZooKeeper."""
    require_server("zookeeper")
    return _server_factory(_factory, ZooKeeperServer)


@pytest.fixture
def etcd_factory(_factory: _Factory) -> Callable[..., EtcdServer]:
    """``etcd_factory(port=None, extra_args=())``: a single-member etcd."""
    require_server("etcd")
    return _server_factory(_factory, EtcdServer)


@pytest.fixture
def mariadb_factory(_factory: _Factory) -> Callable[..., MariaDBServer]:
    """``mariadb_factory(port=None, database="aiodlock_test", extra_args=())``."""
    require_server("mysql")
    return _server_factory(_factory, MariaDBServer)


@pytest.fixture
def postgres_factory(_factory: _Factory) -> Callable[..., PostgresServer]:
    """``postgres_factory(port=None, database="postgres", extra_args=())``."""
    require_server("postgres")
    return _server_factory(_factory, PostgresServer)


@pytest.fixture
def redis_many(_factory: _Factory) -> Callable[..., RedisGroup]:
    """``redis_many(n, **redis_kwargs)``: ``n`` independent Redis masters, started together."""
    require_server("redis")

    def start(n: int, **kwargs: Any) -> RedisGroup:
        group = RedisGroup(_factory.base, n, **kwargs)
        _factory.add(group.close)
        return group.start()

    return start


@pytest.fixture
def zookeeper_ensemble(_factory: _Factory) -> Callable[..., ZooKeeperEnsemble]:
    """``zookeeper_ensemble(size=3)``: a ZooKeeper quorum on loopback."""
    require_server("zookeeper")

    def start(size: int = 3) -> ZooKeeperEnsemble:
        ensemble = ZooKeeperEnsemble(_factory.base, size)
        _factory.add(ensemble.close)
        return ensemble.start()

    return start


@pytest.fixture
def etcd_cluster(_factory: _Factory) -> Callable[..., EtcdCluster]:
    """``etcd_cluster(size=3)``: an etcd cluster on loopback."""
    require_server("etcd")

    def start(size: int = 3) -> EtcdCluster:
        cluster = EtcdCluster(_factory.base, size)
        _factory.add(cluster.close)
        return cluster.start()

    return start


@pytest.fixture
def sentinel_factory(_factory: _Factory) -> Callable[..., SentinelDeployment]:
    """``sentinel_factory(down_after_ms=500)``: a private Sentinel deployment."""
    require_server("redis")

    def start(**kwargs: Any) -> SentinelDeployment:
        base = _factory.base / f"sentinel{len(_factory.closers)}"
        deployment = SentinelDeployment(base, **kwargs)
        _factory.add(deployment.close)
        return deployment.start()

    return start


@pytest.fixture
def cluster_factory(_factory: _Factory) -> Callable[[], ClusterDeployment]:
    """``cluster_factory()``: a private three-master Redis Cluster."""
    require_server("redis")

    def start() -> ClusterDeployment:
        deployment = ClusterDeployment(_factory.base / f"cluster{len(_factory.closers)}")
        _factory.add(deployment.close)
        return deployment.start()

    return start


# -- clients: one fixture for every folder --------------------------------------------------
# A folder says where its locks live (``lock_url``) and, where it differs, with which options
# (``client_options``); ``make_client`` and ``client`` are the same everywhere.


@pytest.fixture
def namespace() -> str:
    """A fresh namespace per test (the servers are shared)."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client_options(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "op_timeout": 5.0}


@pytest.fixture
async def make_client(
    lock_url: str, client_options: dict[str, Any]
) -> AsyncIterator[ClientFactory]:
    """``await make_client(url=None, **options)``: an open client, closed at teardown."""
    async with open_clients(lock_url, **client_options) as make:
        yield make


@pytest.fixture
async def client(make_client: ClientFactory) -> aiodlock.Client:
    return await make_client()


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[ServeFactory]:
    """``await serve(url, name, "option=value", ...)``: a worker process in serve mode."""
    async with serving(tmp_path) as start:
        yield start
