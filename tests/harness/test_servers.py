"""The real-server harness itself: every server starts, answers, pauses, dies and comes back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.servers import (
    EtcdCluster,
    EtcdServer,
    MariaDBServer,
    PostgresServer,
    RedisGroup,
    RedisServer,
    ServerError,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    binary_missing,
    free_port,
)

ROOT = Path(__file__).resolve().parents[2]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting for a parent that does not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- generic -----------------------------------------------------------------------------------


def test_free_port_never_hands_out_the_same_port_twice() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:  # and a handed-out port is really free
        sock.bind(("127.0.0.1", ports[-1]))


def test_binary_missing_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="unknown server kind"):
        binary_missing("oracle")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: nothing can be found
    reason = binary_missing("etcd")
    assert reason is not None
    assert "etcd" in reason
    assert "etcdctl" in reason


def test_servers_die_with_a_crashed_parent(tmp_path: Path) -> None:
    """No orphans: a Python process that dies without cleanup takes its servers with it."""
    if binary_missing("redis"):
        pytest.skip(str(binary_missing("redis")))
    script = (
        "import os, sys\n"
        "from tests.servers import RedisServer\n"
        "a = RedisServer(sys.argv[1]).start()\n"
        "b = RedisServer(sys.argv[1]).start()\n"
        "print(a.pid, b.pid, flush=True)\n"
        "if sys.argv[2] == 'crash':\n"
        "    os._exit(3)  # no atexit: the parent-death signal must do it\n"
    )
    for mode in ("exit", "crash"):
        result = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path), mode],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.stdout.strip(), result.stderr
        for pid in map(int, result.stdout.split()):
            assert _wait_gone(pid), f"redis-server {pid} survived its parent ({mode})"


@pytest.mark.redis
def test_start_failure_raises_with_the_log_tail(tmp_path: Path) -> None:
    if binary_missing("redis"):
        pytest.skip(str(binary_missing("redis")))
    server = RedisServer(tmp_path, extra_args=["--no-such-directive", "yes"])
    with pytest.raises(ServerError, match=r"(?s)exited with code.*no-such-directive"):
        server.start(timeout=10)
    assert not server.running
    server.close()


# -- Redis -------------------------------------------------------------------------------------


@pytest.mark.redis
def test_redis_answers(redis_server: RedisServer) -> None:
    assert redis_server.ping()
    assert redis_server.cli("PING") == "PONG"
    assert redis_server.host == "127.0.0.1"
    assert redis_server.port not in (6379, 0)
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    with socket.create_connection((redis_server.host, redis_server.port), timeout=2) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"


@pytest.mark.redis
def test_redis_pause_and_resume(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    pid = server.pid
    server.pause()
    assert (server.paused, server.running) == (True, True)
    started = time.monotonic()
    assert not server.ping(timeout=0.2)
    assert time.monotonic() - started < 1.0
    server.resume()
    assert (server.paused, server.ping(), server.pid) == (False, True, pid)


@pytest.mark.redis
def test_redis_password_and_extra_args(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory(password="s3cret", extra_args=["--maxmemory", "12mb"])
    assert server.url == f"redis://:s3cret@127.0.0.1:{server.port}/0"
    assert server.ping()  # -NOAUTH counts as an answer
    assert server.cli("PING") == "PONG"
    assert server.cli("CONFIG", "GET", "maxmemory").splitlines()[1] == str(12 * 1024 * 1024)


@pytest.mark.redis
def test_redis_stop_and_close_are_idempotent(tmp_path: Path) -> None:
    if binary_missing("redis"):
        pytest.skip(str(binary_missing("redis")))
    with RedisServer(tmp_path) as server:
        assert server.ping()
        server.stop()
        server.stop()
        assert (server.running, server.pid) == (False, None)
    server.close()
    server.kill()


@pytest.mark.slow
@pytest.mark.redis
def test_redis_kill_and_restart_on_the_same_port(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    port, pid = server.port, server.pid
    assert server.cli("SET", "k", "v") == "OK"
    server.kill()
    assert not server.running
    assert server.pid is None
    assert not server.ping(timeout=0.2)
    server.restart()
    assert server.port == port
    assert server.pid != pid
    assert server.cli("GET", "k") == ""  # no persistence: the data is gone
    server.restart(hard=True)  # SIGKILL + start
    assert server.ping()


@pytest.mark.redis
def test_five_independent_redis_masters(redis_many: Callable[..., RedisGroup]) -> None:
    started = time.monotonic()
    group = redis_many(5)
    elapsed = time.monotonic() - started
    assert len(group) == 5
    assert len(set(group.ports)) == 5
    assert all(server.ping() for server in group)
    group[0].cli("SET", "only-here", "1")
    assert [server.cli("EXISTS", "only-here") for server in group] == ["1", "0", "0", "0", "0"]
    assert elapsed < 10


# the shared servers are healed between tests: these run in file order


_shared_state: dict[str, int | None] = {}


@pytest.mark.redis
def test_shared_redis_left_paused(redis_server: RedisServer) -> None:
    _shared_state["paused_pid"] = redis_server.pid
    redis_server.pause()


@pytest.mark.redis
def test_shared_redis_is_resumed_for_the_next_test(redis_server: RedisServer) -> None:
    assert redis_server.ping(timeout=1.0)
    if "paused_pid" in _shared_state:
        assert redis_server.pid == _shared_state["paused_pid"]


@pytest.mark.redis
def test_shared_redis_left_dead(redis_server: RedisServer) -> None:
    _shared_state["dead_pid"] = redis_server.pid
    _shared_state["dead_port"] = redis_server.port
    redis_server.kill()


@pytest.mark.redis
def test_shared_redis_is_restarted_for_the_next_test(redis_server: RedisServer) -> None:
    assert redis_server.ping(timeout=1.0)
    if "dead_pid" in _shared_state:
        assert redis_server.pid != _shared_state["dead_pid"]
        assert redis_server.port == _shared_state["dead_port"]


# -- ZooKeeper ---------------------------------------------------------------------------------


@pytest.mark.zookeeper
def test_zookeeper_answers(zookeeper_server: ZooKeeperServer) -> None:
    assert zookeeper_server.mode() == "standalone"
    assert "Mode: standalone" in zookeeper_server.four_letter("srvr")
    assert zookeeper_server.four_letter("ruok") == "imok"
    assert zookeeper_server.url == f"zookeeper://127.0.0.1:{zookeeper_server.port}"


@pytest.mark.zookeeper
def test_zookeeper_pause_and_resume(zookeeper_factory: Callable[..., ZooKeeperServer]) -> None:
    server = zookeeper_factory()
    server.pause()
    with pytest.raises(OSError):
        server.four_letter("srvr", timeout=0.3)
    assert server.mode(timeout=0.3) is None
    server.resume()
    assert server.mode() == "standalone"


@pytest.mark.slow
@pytest.mark.zookeeper
def test_zookeeper_kill_and_restart_keep_the_data(
    zookeeper_factory: Callable[..., ZooKeeperServer],
) -> None:
    server = zookeeper_factory()
    port = server.port
    server.cli("create", "/harness", "hello")
    server.kill()
    assert not server.running
    assert server.mode(timeout=0.3) is None
    server.restart()
    assert server.port == port
    assert server.cli("get", "/harness") == "hello"
    server.restart(wipe=True)
    assert "Node does not exist" in server.cli("get", "/harness", check=False)


@pytest.mark.slow
@pytest.mark.zookeeper
def test_zookeeper_ensemble_survives_a_member_loss(
    zookeeper_ensemble: Callable[..., ZooKeeperEnsemble],
) -> None:
    ensemble = zookeeper_ensemble(3)
    assert sorted(member.mode() or "" for member in ensemble) == ["follower", "follower", "leader"]
    assert ensemble.url == "zookeeper://" + ",".join(f"127.0.0.1:{p}" for p in ensemble.ports)
    ensemble.cli("create", "/before", "1")

    old_leader = ensemble.leader()
    old_leader.kill()
    new_leader = ensemble.leader(timeout=15)
    assert new_leader is not old_leader
    ensemble.cli("create", "/during", "2")  # two of three still make a quorum

    old_leader.restart()
    assert old_leader.mode() == "follower"
    assert old_leader.cli("get", "/during") == "2"


# -- etcd --------------------------------------------------------------------------------------


@pytest.mark.etcd
def test_etcd_answers(etcd_server: EtcdServer) -> None:
    key = _unique("harness")
    assert etcd_server.cli("put", key, "v1") == "OK"
    assert etcd_server.cli("get", key, "--print-value-only") == "v1"
    assert etcd_server.url == f"etcd://127.0.0.1:{etcd_server.port}"
    assert etcd_server.is_leader()


@pytest.mark.etcd
def test_etcd_pause_and_resume(etcd_factory: Callable[..., EtcdServer]) -> None:
    server = etcd_factory()
    server.pause()
    assert not server.ping(timeout=0.3)
    server.resume()
    assert server.ping()
    assert server.cli("put", "k", "v") == "OK"


@pytest.mark.slow
@pytest.mark.etcd
def test_etcd_kill_and_restart_keep_the_data(etcd_factory: Callable[..., EtcdServer]) -> None:
    server = etcd_factory()
    port = server.port
    server.cli("put", "k", "kept")
    server.kill()
    assert not server.ping(timeout=0.2)
    server.restart()
    assert server.port == port
    assert server.cli("get", "k", "--print-value-only") == "kept"
    server.restart(wipe=True)
    assert server.cli("get", "k", "--print-value-only") == ""


@pytest.mark.slow
@pytest.mark.etcd
def test_etcd_cluster_survives_a_member_loss(etcd_cluster: Callable[..., EtcdCluster]) -> None:
    cluster = etcd_cluster(3)
    assert cluster.url == "etcd://" + ",".join(f"127.0.0.1:{p}" for p in cluster.ports)
    cluster.cli("put", "k", "before")

    old_leader = cluster.leader()
    old_leader.kill()
    cluster.wait_ready()  # the two others elect a leader and serve again
    assert cluster.leader() is not old_leader
    assert cluster.cli("put", "k", "during") == "OK"

    old_leader.restart()  # rejoins with its data dir
    assert old_leader.cli("get", "k", "--print-value-only") == "during"

    cluster.restart(wipe=True)  # a brand-new cluster on the same ports
    assert cluster.cli("get", "k", "--print-value-only") == ""


# -- MariaDB -----------------------------------------------------------------------------------


@pytest.mark.mysql
def test_mariadb_answers(mariadb_server: MariaDBServer) -> None:
    assert mariadb_server.sql("SELECT 1") == [("1",)]
    assert mariadb_server.sql("SELECT DATABASE()") == [("aiodlock_test",)]
    assert mariadb_server.url == f"mysql://root@127.0.0.1:{mariadb_server.port}/aiodlock_test"
    # root without a password over TCP, as the URL says
    result = subprocess.run(
        [
            "mariadb",
            "--no-defaults",
            "--protocol=TCP",
            "-h",
            mariadb_server.host,
            "-P",
            str(mariadb_server.port),
            "-u",
            "root",
            "--batch",
            "--skip-column-names",
            "-e",
            "SELECT CURRENT_USER()",
            "aiodlock_test",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stdout.strip() == "root@127.0.0.1"


# -- PostgreSQL ----------------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_answers_and_wants_the_password_over_tcp(
    postgres_server: PostgresServer,
) -> None:
    assert postgres_server.sql("SELECT 1") == [("1",)]
    assert postgres_server.port != 5432
    assert postgres_server.url == (
        f"postgresql://postgres:{postgres_server.password}@127.0.0.1:{postgres_server.port}"
        "/postgres"
    )
    tcp = ["psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(postgres_server.port),
           "-U", "postgres", "-d", "postgres", "-c", "SELECT current_user"]  # fmt: skip
    env = {**os.environ, "PGPASSWORD": postgres_server.password, "PGCONNECT_TIMEOUT": "10"}
    ok = subprocess.run(tcp, capture_output=True, text=True, timeout=30, env=env, check=True)
    assert ok.stdout.strip() == "postgres"
    env["PGPASSWORD"] = "wrong"
    bad = subprocess.run(tcp, capture_output=True, text=True, timeout=30, env=env, check=False)
    assert bad.returncode != 0
    assert "password authentication failed" in bad.stderr


#: The SQL servers' factories (pause, kill and restart are tested alike on both).
SQL_SERVERS = [
    pytest.param("mariadb_factory", marks=pytest.mark.mysql, id="mariadb"),
    pytest.param("postgres_factory", marks=pytest.mark.postgres, id="postgres"),
]


@pytest.mark.parametrize("factory", SQL_SERVERS)
def test_sql_server_pause_stops_every_process_and_resume(
    factory: str, request: pytest.FixtureRequest
) -> None:
    server: MariaDBServer | PostgresServer = request.getfixturevalue(factory)()
    server.pause()
    assert not server.ping(timeout=0.3)
    server.resume()
    assert server.ping()
    assert server.sql("SELECT 1 + 1") == [("2",)]


@pytest.mark.slow
@pytest.mark.parametrize("factory", SQL_SERVERS)
def test_sql_server_kill_and_restart_keep_the_data(
    factory: str, request: pytest.FixtureRequest
) -> None:
    server: MariaDBServer | PostgresServer = request.getfixturevalue(factory)()
    port = server.port
    server.sql("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    server.sql("INSERT INTO t VALUES (1, 'kept'), (2, NULL)")
    if isinstance(server, PostgresServer):
        server.sql("CHECKPOINT")  # (fsync is off: make the data reach the files)
    server.kill()
    assert not server.ping(timeout=0.2)
    server.restart()
    assert server.port == port
    null = "NULL" if isinstance(server, MariaDBServer) else ""  # (how each client prints it)
    assert server.sql("SELECT id, v FROM t ORDER BY id") == [("1", "kept"), ("2", null)]
    server.restart(wipe=True)  # a fresh data directory (MariaDB's database created again)
    tables = "SELECT count(*) FROM information_schema.tables WHERE table_name = 't'"
    assert server.sql(tables) == [("0",)]
