"""Fixtures for the Redis backend tests: clients, a raw redis client, Sentinel and Cluster.

The shared ``redis_server`` (tests/conftest.py) serves the protocol tests; every test uses a
fresh namespace.  Fault tests take private servers from ``redis_factory``.  The Sentinel
(a master, a replica, three sentinels) and Cluster (three masters) deployments are built
here on top of ``tests.servers.RedisServer``, on loopback ports.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from tests.conftest import require_server
from tests.servers import HOST, RedisServer, ServerError, free_port

from .redis_helpers import RawFactory

SERVICE = "mymaster"


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def lock_url(redis_url: str) -> str:
    return redis_url


@pytest.fixture
async def raw_factory(redis_url: str) -> AsyncIterator[RawFactory]:
    """``raw_factory(url=None)``: a plain redis.asyncio client, to look at keys directly."""
    made: list[aioredis.Redis] = []

    def make(url: str | None = None) -> aioredis.Redis:
        raw = aioredis.Redis.from_url(url or redis_url)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        with contextlib.suppress(Exception):
            await raw.aclose()


@pytest.fixture
def raw(raw_factory: RawFactory) -> aioredis.Redis:
    return raw_factory()


# -- Sentinel -----------------------------------------------------------------------------------


class SentinelDeployment:
    """A master, one replica and three sentinels (quorum 2) on loopback."""

    def __init__(self, base: Path, *, down_after_ms: int = 500) -> None:
        self.base = base
        # no diskless-sync delay: the replica syncs at once (else 5 s per deployment)
        self.master = RedisServer(base, extra_args=["--repl-diskless-sync-delay", "0"])
        self.replica: RedisServer | None = None
        self.sentinels: list[RedisServer] = []
        self.down_after_ms = down_after_ms

    def start(self) -> SentinelDeployment:
        try:
            self.master.start()
            self.replica = RedisServer(
                self.base, extra_args=["--replicaof", HOST, str(self.master.port)]
            ).start()
            config = (
                f"sentinel monitor {SERVICE} {HOST} {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
            self.sentinels = [
                RedisServer(self.base, config_text=config, extra_args=["--sentinel"])
                for _ in range(3)
            ]
            for sentinel in self.sentinels:
                sentinel.spawn()
            for sentinel in self.sentinels:
                sentinel.wait_ready()
            self.wait_replica_online(self.master, self.replica)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def members(self) -> list[RedisServer]:
        return [self.master, *([self.replica] if self.replica else []), *self.sentinels]

    @property
    def url(self) -> str:
        hosts = ",".join(s.address for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def master_port(self) -> int:
        """The master port as the first live sentinel reports it."""
        for sentinel in self.sentinels:
            if sentinel.running and not sentinel.paused:
                out = sentinel.cli("SENTINEL", "get-master-addr-by-name", SERVICE, check=False)
                lines = out.split()
                if len(lines) == 2:
                    return int(lines[1])
        raise ServerError("no sentinel answered")

    @staticmethod
    def wait_replica_online(master: RedisServer, replica: RedisServer, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            info = master.cli("INFO", "replication", check=False)
            if f"port={replica.port},state=online" in info:
                return
            if time.monotonic() > deadline:
                raise ServerError(f"replica {replica.port} not online:\n{info}")
            time.sleep(0.02)

    def wait_failover_ready(self, timeout: float = 30) -> None:
        """Every sentinel knows the replica and the two other sentinels."""
        assert self.replica is not None
        deadline = time.monotonic() + timeout
        while True:
            ready = True
            for sentinel in self.sentinels:
                replicas = sentinel.cli("SENTINEL", "replicas", SERVICE, check=False)
                others = sentinel.cli("SENTINEL", "sentinels", SERVICE, check=False)
                if str(self.replica.port) not in replicas or others.count(HOST) < 2:
                    ready = False
                    break
            if ready:
                return
            if time.monotonic() > deadline:
                raise ServerError("the sentinels did not discover each other in time")
            time.sleep(0.1)

    def wait_master(self, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.master_port() != port:
            if time.monotonic() > deadline:
                raise ServerError(f"sentinels did not promote {port} in time")
            time.sleep(0.05)

    def close(self) -> None:
        for member in reversed(self.members):
            with contextlib.suppress(Exception):
                member.close()


@pytest.fixture
def sentinel_factory(tmp_path: Path) -> Iterator[Callable[..., SentinelDeployment]]:
    """``sentinel_factory(down_after_ms=500)``: a private deployment (closed at teardown)."""
    require_server("redis")
    made: list[SentinelDeployment] = []

    def make(**kwargs: Any) -> SentinelDeployment:
        deployment = SentinelDeployment(tmp_path / f"sentinel{len(made)}", **kwargs)
        made.append(deployment)
        return deployment.start()

    yield make
    for deployment in made:
        deployment.close()


@pytest.fixture(scope="session")
def sentinel_deployment(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SentinelDeployment]:
    """A shared deployment for tests that do not fail it over."""
    require_server("redis")
    deployment = SentinelDeployment(tmp_path_factory.mktemp("sentinel")).start()
    yield deployment
    deployment.close()


# -- Cluster ------------------------------------------------------------------------------------


class ClusterDeployment:
    """Three Redis Cluster masters covering all 16384 slots (no replicas)."""

    def __init__(self, base: Path, size: int = 3) -> None:
        # An explicit bus port: the default (port + 10000) overflows for the high ports
        # that free_port() may hand out.
        self.base = base
        self.nodes = [self._node() for _ in range(size)]
        self.replicas: list[RedisServer] = []

    def _node(self) -> RedisServer:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0"]
        return RedisServer(self.base, extra_args=[*args, "--cluster-port", str(free_port())])

    def start(self) -> ClusterDeployment:
        try:
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                node.wait_ready()
            addresses = [node.address for node in self.nodes]
            command = ["redis-cli", "--cluster", "create", *addresses]
            command += ["--cluster-replicas", "0", "--cluster-yes"]
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=60, check=False
            )
            if result.returncode != 0:
                raise ServerError(f"redis-cli --cluster create failed: {result.stderr}")
            deadline = time.monotonic() + 30
            while not all(
                "cluster_state:ok" in node.cli("CLUSTER", "INFO", check=False)
                for node in self.nodes
            ):
                if time.monotonic() > deadline:
                    raise ServerError("the cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(node.address for node in self.nodes[:2])

    def add_replica(self, master: RedisServer, timeout: float = 30) -> RedisServer:
        """A new node that joins the cluster as a replica of ``master`` (online on return)."""
        replica = self._node()
        self.replicas.append(replica)
        replica.start()
        bus_port = master.extra_args[master.extra_args.index("--cluster-port") + 1]
        replica.cli("CLUSTER", "MEET", HOST, str(master.port), bus_port)
        master_id = master.cli("CLUSTER", "MYID")
        deadline = time.monotonic() + timeout
        while master_id not in replica.cli("CLUSTER", "NODES", check=False):
            if time.monotonic() > deadline:
                raise ServerError("the new node did not learn about its master")
            time.sleep(0.05)
        replica.cli("CLUSTER", "REPLICATE", master_id)
        SentinelDeployment.wait_replica_online(master, replica, timeout)
        # Every master must know the replica (by gossip from its master, which alone met
        # it): a master that does not know it ignores its call for votes after a failover.
        replica_id = replica.cli("CLUSTER", "MYID")
        while not all(
            f"{replica_id} " in n.cli("CLUSTER", "NODES", check=False) for n in self.nodes
        ):
            if time.monotonic() > deadline:
                raise ServerError("the masters did not learn about the new replica")
            time.sleep(0.05)
        # Online is not enough: wait until a write is acknowledged (the replica may still be
        # loading what it was sent).
        probe = self.key_on(master)
        while True:
            result = subprocess.run(
                ["redis-cli", "-h", HOST, "-p", str(master.port)],
                input=f"SET {probe} 1\nWAIT 1 200\n",
                capture_output=True, text=True, timeout=10, check=False,
            )  # fmt: skip
            if result.stdout.split()[-1:] == ["1"]:
                return replica
            if time.monotonic() > deadline:
                raise ServerError(f"the replica does not acknowledge writes: {result.stdout}")

    def wait_promoted(self, replica: RedisServer, timeout: float = 30) -> None:
        """Wait until ``replica`` serves as a master and the live masters agree the cluster
        is whole again (after its master was killed: node timeout, then an election)."""
        survivors = [replica, *(n for n in self.nodes if n.running)]
        deadline = time.monotonic() + timeout
        while not (
            replica.cli("ROLE", check=False).startswith("master")
            and all("cluster_state:ok" in n.cli("CLUSTER", "INFO", check=False) for n in survivors)
        ):
            if time.monotonic() > deadline:
                raise ServerError("the replica was not promoted in time")
            time.sleep(0.05)

    def migrate_slot(self, slot: int, source: RedisServer, target: RedisServer) -> int:
        """Move ``slot`` with its keys from master ``source`` to master ``target`` (what a
        resharding does, one slot); returns how many keys moved."""
        source_id, target_id = source.cli("CLUSTER", "MYID"), target.cli("CLUSTER", "MYID")
        target.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)
        source.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)
        keys = source.cli("CLUSTER", "GETKEYSINSLOT", str(slot), "1000").split()
        if keys:
            moved = source.cli("MIGRATE", HOST, str(target.port), "", "0", "5000", "KEYS", *keys)
            if moved != "OK":
                raise ServerError(f"MIGRATE failed: {moved}")
        for node in self.nodes:
            if node.running:
                node.cli("CLUSTER", "SETSLOT", str(slot), "NODE", target_id)
        return len(keys)

    @staticmethod
    def key_on(master: RedisServer) -> str:
        """A key whose slot ``master`` serves."""
        line = next(ln for ln in master.cli("CLUSTER", "NODES").splitlines() if "myself" in ln)
        slots: set[int] = set()
        for part in line.split()[8:]:
            if not part.startswith("["):
                first, _, last = part.partition("-")
                slots.update(range(int(first), int(last or first) + 1))
        for i in itertools.count():
            if key_slot(f"probe{i}".encode()) in slots:
                return f"probe{i}"
        raise AssertionError("unreachable")

    def close(self) -> None:
        for node in [*self.replicas, *self.nodes]:
            with contextlib.suppress(Exception):
                node.close()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[[], ClusterDeployment]]:
    """``cluster_factory()``: a private cluster (closed at teardown)."""
    require_server("redis")
    made: list[ClusterDeployment] = []

    def make() -> ClusterDeployment:
        deployment = ClusterDeployment(tmp_path / f"cluster{len(made)}")
        made.append(deployment)
        return deployment.start()

    yield make
    for deployment in made:
        deployment.close()


@pytest.fixture(scope="session")
def cluster_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterDeployment]:
    require_server("redis")
    deployment = ClusterDeployment(tmp_path_factory.mktemp("cluster")).start()
    yield deployment
    deployment.close()
