"""Real database servers for the aiodlock test-suite: start, pause, kill and restart them.

Plain synchronous, standard-library-only code (it must not import aiodlock), so that it works
from any fixture, any event loop and from helper scripts.  Every server listens on a free
loopback port and keeps its files in a private directory under the base directory it is
given; nothing here touches servers on the standard ports (6379, 3306, 2181, 2379, 5432).

Readiness rules (from the team's drivers.md design notes):

* Redis:      ``PING`` on a raw socket answers ``+PONG`` (or ``-NOAUTH`` with a password);
* ZooKeeper:  the ``srvr`` four-letter word shows ``Mode:`` (``ruok`` answers too early);
* etcd:       ``GET /health`` says ``"health": "true"``;
* MariaDB:    a TCP connection receives a protocol-10 handshake packet;
* PostgreSQL: a startup packet on its Unix socket is answered by an authentication request
  (``R``), not an error (``E``: "the database system is starting up").

Every process is started in its own session with a parent-death signal (when spawned from the
main thread) and registered for an ``atexit`` SIGKILL, so a crashed test run leaves no orphans.
"""

from __future__ import annotations

import atexit
import binascii
import contextlib
import ctypes
import ctypes.util
import itertools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Generic, Self, TypeVar

__all__ = [
    "HOST",
    "ClusterDeployment",
    "EtcdCluster",
    "EtcdServer",
    "MariaDBServer",
    "PostgresServer",
    "RedisGroup",
    "RedisServer",
    "SentinelDeployment",
    "Server",
    "ServerError",
    "ServerGroup",
    "ZooKeeperEnsemble",
    "ZooKeeperPeer",
    "ZooKeeperServer",
    "binary_missing",
    "etcdctl",
    "free_port",
    "start_many_redis",
    "zookeeper_classpath",
    "zookeeper_cli",
]

HOST = "127.0.0.1"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 40

JAVA_DIR = Path("/usr/share/java")
# The Debian zookeeper.jar carries a manifest Class-Path (jute, slf4j-api, netty, metrics, ...);
# the jars are also listed explicitly so that a jar without that manifest works as well.
# slf4j-simple is the logging backend (without it ZooKeeper logs nothing at all).
ZOOKEEPER_JARS = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-simple.jar",
    "netty-handler.jar",
    "netty-transport.jar",
    "netty-buffer.jar",
    "netty-common.jar",
    "netty-codec.jar",
    "netty-resolver.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
    "metrics-core.jar",
    "snappy-java.jar",
    "commons-cli.jar",
)
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData")
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
MAX_UNIX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux


class ServerError(RuntimeError):
    """A server did not start, did not get ready or did not answer."""


# --------------------------------------------------------------------------------------------
# ports, binaries, processes
# --------------------------------------------------------------------------------------------

_ports_lock = threading.Lock()
_ports_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now and was never handed out before in this process."""
    with _ports_lock:
        for _ in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((HOST, 0))
                port: int = sock.getsockname()[1]
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return port
    raise ServerError("could not find a free loopback port")


def _reserve_port(port: int) -> int:
    with _ports_lock:
        _ports_handed_out.add(port)
    return port


def _which(name: str) -> str | None:
    found = shutil.which(name)
    if found is None:
        # (Debian keeps initdb and postgres off PATH, in /usr/lib/postgresql/VERSION/bin)
        pg_dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
        for directory in [*SBIN_DIRS, *pg_dirs]:
            candidate = Path(directory, name)
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return found


def _need(name: str) -> str:
    path = _which(name)
    if path is None:
        raise ServerError(f"{name} not found on PATH (run scripts/install-servers)")
    return path


def zookeeper_classpath() -> str | None:
    """The Java classpath for ZooKeeper, or None when the jar is missing.

    ``AIODLOCK_ZOOKEEPER_CLASSPATH`` overrides the Debian layout (e.g. ``/opt/zookeeper/lib/*``).
    """
    override = os.environ.get("AIODLOCK_ZOOKEEPER_CLASSPATH")
    if override:
        return override
    if not (JAVA_DIR / "zookeeper.jar").is_file():
        return None
    jars = [str(JAVA_DIR / jar) for jar in ZOOKEEPER_JARS if (JAVA_DIR / jar).is_file()]
    return os.pathsep.join(jars)


_KIND_BINARIES: dict[str, tuple[str, ...]] = {
    "redis": ("redis-server", "redis-cli"),
    "zookeeper": ("java",),
    "etcd": ("etcd", "etcdctl"),
    "mysql": ("mariadbd", "mariadb-install-db", "mariadb"),
    "postgres": ("initdb", "postgres"),
}
_KIND_ALIASES = {
    "mariadb": "mysql",
    "redlock": "redis",
    "zk": "zookeeper",
    "postgresql": "postgres",
}


def binary_missing(kind: str) -> str | None:
    """Why servers of ``kind`` cannot run here, or None when they can.

    ``kind`` is one of ``redis``, ``zookeeper``, ``etcd``, ``mysql``, ``postgres`` (aliases:
    ``mariadb``, ``redlock``, ``zk``, ``postgresql``).
    """
    kind = _KIND_ALIASES.get(kind, kind)
    if kind not in _KIND_BINARIES:
        raise ValueError(f"unknown server kind {kind!r}")
    missing = [name for name in _KIND_BINARIES[kind] if _which(name) is None]
    if kind == "zookeeper" and zookeeper_classpath() is None:
        missing.append(str(JAVA_DIR / "zookeeper.jar"))
    if missing:
        names = ", ".join(missing)
        return f"{kind} server not available: missing {names} (run scripts/install-servers)"
    return None


_children_lock = threading.Lock()
_children: dict[int, subprocess.Popen[bytes]] = {}


def _load_prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _spawn(
    cmd: Sequence[str], *, cwd: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session, stdout+stderr appended to ``log``."""
    parent = os.getpid()
    preexec: Callable[[], None] | None = None
    # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only use it from the main
    # thread (a worker thread of asyncio.to_thread() may go away while the server should live).
    if _PRCTL is not None and threading.current_thread() is threading.main_thread():
        prctl = _PRCTL

        def preexec() -> None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl() took effect
                os._exit(1)

    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
        )
    with _children_lock:
        _children[proc.pid] = proc
    return proc


def _forget(proc: subprocess.Popen[bytes]) -> None:
    with _children_lock:
        _children.pop(proc.pid, None)


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to the process group of ``proc`` unless it has been reaped already."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/PID/stat (``T`` = stopped), None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def _kill_all_children() -> None:
    with _children_lock:
        procs = list(_children.values())
        _children.clear()
    for proc in procs:
        _signal(proc, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)


atexit.register(_kill_all_children)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _short_dir(preferred: Path, leaf: str, prefix: str) -> Path:
    """``preferred`` when a Unix socket ``preferred/leaf`` fits in sun_path, else a /tmp dir."""
    if len(str(preferred / leaf)) <= MAX_UNIX_SOCKET_PATH:
        return preferred
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(
    method: str, url: str, body: bytes | None = None, timeout: float = 1.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with _NO_PROXY_OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


# --------------------------------------------------------------------------------------------
# one server process
# --------------------------------------------------------------------------------------------


class Server:
    """One server process on a loopback port with a private work directory.

    Lifecycle: ``start()`` = ``spawn()`` + ``wait_ready()``; ``stop()`` (SIGTERM, then SIGKILL),
    ``kill()`` (SIGKILL), ``pause()`` (SIGSTOP), ``resume()`` (SIGCONT), ``restart()`` (same port;
    data kept unless ``wipe=True``), ``close()`` (kill and delete the data directory).
    """

    kind: ClassVar[str] = "server"
    scheme: ClassVar[str] = ""
    probe_timeout: ClassVar[float] = 0.5

    def __init__(self, base_dir: str | os.PathLike[str], port: int | None = None) -> None:
        base = Path(base_dir)
        base.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.kind}-", dir=base))
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / f"{self.kind}.log"  # the server's own log
        self.console_path = self.workdir / "console.log"  # its stdout/stderr
        self._port_fixed = port is not None
        self._port = _reserve_port(port) if port is not None else free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._log_offsets: dict[Path, int] = {}
        self._extra_cleanup: list[Path] = []
        self.starts = 0  # how many times a process was spawned

    # -- identity -----------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{HOST}:{self._port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        """The process exists (it may be paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self.running and self._paused

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.address} pid={self.pid} {state}>"

    # -- to be provided by subclasses -----------------------------------------------------------

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Create configuration and data files before a spawn (must keep existing data)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def ping(self, timeout: float = 0.5) -> bool:
        """One readiness probe: True when the server answers within ``timeout`` seconds."""
        raise NotImplementedError

    def _after_ready(self) -> None:
        """Runs once the server answers (e.g. create a database)."""

    def _env(self) -> dict[str, str] | None:
        return None

    def _log_files(self) -> list[Path]:
        return [self.log_path, self.console_path]

    # -- lifecycle ----------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the process without waiting for it to be ready."""
        if self.running:
            raise ServerError(f"{self!r} is already running")
        self._forget()  # a process that died on its own
        self._prepare()
        self._log_offsets = {path: _file_size(path) for path in self._log_files()}
        self._paused = False
        self._proc = _spawn(
            self._command(), cwd=self.workdir, log=self.console_path, env=self._env()
        )
        self.starts += 1

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll until the server answers; ServerError with the log tail otherwise."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            if not self.running:
                raise ServerError(
                    f"{self.kind} on {self.address} exited with code {self.returncode} before "
                    f"it was ready\n{self.log_tail()}"
                )
            if self.ping(timeout=self.probe_timeout):
                break
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.kind} on {self.address} (pid {self.pid}) not ready after "
                    f"{timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)
        self._after_ready()

    def start(self, timeout: float = READY_TIMEOUT) -> Self:
        """Spawn and wait until ready.  Returns ``self``.

        On the very first start, a port taken by someone else in the meantime (the port was
        picked by ``free_port()``, not given by the caller) is replaced by a fresh one.
        """
        attempts = 1 if self._port_fixed or self.starts else 3
        for attempt in range(attempts):
            self.spawn()
            try:
                self.wait_ready(timeout)
            except ServerError:
                self.kill()
                if attempt + 1 < attempts and self._port_in_use():
                    self._port = free_port()
                    self._on_port_change()
                    continue
                raise
            return self
        raise AssertionError("unreachable")

    def _on_port_change(self) -> None:
        """Hook for servers whose files mention the port."""

    def _port_in_use(self) -> bool:
        text = "".join(
            _read_from(path, self._log_offsets.get(path, 0)) for path in self._log_files()
        )
        return "already in use" in text.lower()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL.  Idempotent; works when paused."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _signal(proc, signal.SIGTERM)
            _signal(proc, signal.SIGCONT)  # a stopped process only acts on SIGTERM once resumed
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL and wait for the process to exit.  Idempotent."""
        proc = self._proc
        if proc is None:
            return
        _signal(proc, signal.SIGKILL)
        proc.wait()
        self._forget()

    def _forget(self) -> None:
        if self._proc is not None:
            _forget(self._proc)
        self._proc = None
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers."""
        proc = self._require_running()
        _signal(proc, signal.SIGSTOP)
        self._paused = True
        self._wait_state(proc.pid, stopped=True)

    def resume(self) -> None:
        """SIGCONT.  Harmless when not paused."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        _signal(proc, signal.SIGCONT)
        self._paused = False
        self._wait_state(proc.pid, stopped=False)

    def _wait_state(self, pid: int, *, stopped: bool) -> None:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            state = _proc_state(pid)
            if state is None or (state in "Tt") == stopped:
                return
            time.sleep(0.001)

    def restart(
        self, *, wipe: bool = False, hard: bool = False, timeout: float = READY_TIMEOUT
    ) -> Self:
        """Stop (``hard=True``: SIGKILL) if running, then start again on the same port.

        Data survives unless ``wipe=True`` (Redis runs without persistence: its data is gone
        either way).
        """
        if hard:
            self.kill()
        else:
            self.stop()
        if wipe:
            self.wipe()
        return self.start(timeout)

    def wipe(self) -> None:
        """Delete the data directory (the server must not be running)."""
        if self.running:
            raise ServerError(f"cannot wipe {self!r} while it runs")
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def ensure_running(self, timeout: float = READY_TIMEOUT) -> Self:
        """Make a possibly paused or dead server usable again (same port).

        Cheap when the server is fine (no network round trip): it only looks at the process.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._forget()
            return self.start(timeout)
        state = _proc_state(proc.pid)
        if self._paused or (state is not None and state in "Tt"):
            self.resume()
            try:
                self.wait_ready(min(timeout, 5.0))
            except ServerError:
                self.kill()
                return self.start(timeout)
        return self

    def close(self) -> None:
        """Kill the process and delete the data (logs stay in ``workdir``).  Idempotent.

        SIGKILL rather than a clean stop: the data is thrown away anyway, and it is faster.
        """
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        for path in self._extra_cleanup:
            shutil.rmtree(path, ignore_errors=True)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        parts = []
        for path in self._log_files():
            text = _tail(path, lines)
            if text.strip():
                parts.append(f"--- {path} (last {lines} lines) ---\n{text}")
        return "\n".join(parts) or "(no log output)"

    def _require_running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            raise ServerError(f"{self!r} is not running")
        return self._proc

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _send_recv(
    address: tuple[str, int], payload: bytes, timeout: float, until: bytes | None = None
) -> bytes:
    """Send ``payload`` and read until EOF (or until ``until`` appears).  Raises OSError."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.settimeout(timeout)
        if payload:
            sock.sendall(payload)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if until is not None and until in b"".join(chunks):
                break
        return b"".join(chunks)


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------


class RedisServer(Server):
    """``redis-server`` without persistence.

    ``extra_args`` are appended to the command line (``["--maxmemory", "10mb"]``);
    ``config_text`` is written once to ``workdir/redis.conf`` and passed as the config file
    (Sentinel needs a writable one: ``config_text="sentinel monitor ..."``,
    ``extra_args=["--sentinel"]``).  ``password`` sets ``requirepass``.
    """

    kind = "redis"
    scheme = "redis"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        config_text: str | None = None,
    ) -> None:
        super().__init__(base_dir, port)
        self.password = password
        self.extra_args = list(extra_args)
        self.config_text = config_text
        self.config_path = self.workdir / "redis.conf"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.address}/0"

    def url_for(self, db: int) -> str:
        return self.url.rpartition("/")[0] + f"/{db}"

    def _prepare(self) -> None:
        super()._prepare()
        if self.config_text is not None and not self.config_path.exists():
            self.config_path.write_text(self.config_text)

    def _command(self) -> list[str]:
        cmd = [_need("redis-server")]
        if self.config_text is not None:
            cmd.append(str(self.config_path))
        cmd += [
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.data_dir),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            cmd += ["--requirepass", self.password]
        return cmd + self.extra_args

    def ping(self, timeout: float = 0.5) -> bool:
        try:
            reply = _send_recv((HOST, self.port), b"*1\r\n$4\r\nPING\r\n", timeout, until=b"\r\n")
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def wipe(self) -> None:
        super().wipe()
        self.config_path.unlink(missing_ok=True)

    def cli(self, *args: str, timeout: float = 10.0, check: bool = True) -> str:
        """Run ``redis-cli -h 127.0.0.1 -p PORT [-a PASSWORD] ARGS...``; return stdout stripped."""
        cmd = [_need("redis-cli"), "-h", HOST, "-p", str(self.port)]
        if self.password:
            cmd += ["-a", self.password, "--no-auth-warning"]
        result = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise ServerError(f"redis-cli {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout.strip()


# --------------------------------------------------------------------------------------------
# ZooKeeper
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooKeeperPeer:
    """One member of a ZooKeeper ensemble: ``server.MYID=127.0.0.1:PEER:ELECTION``."""

    myid: int
    client_port: int
    peer_port: int
    election_port: int


class ZooKeeperServer(Server):
    """ZooKeeper run as a plain Java class (the Debian wrappers write to /etc and /var/log).

    Standalone by default; with ``peers`` (and ``myid``) it is one member of an ensemble.
    ``extra_config`` lines are added to zoo.cfg.
    """

    kind = "zookeeper"
    scheme = "zookeeper"
    probe_timeout = 1.0

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        myid: int | None = None,
        peers: Sequence[ZooKeeperPeer] = (),
        extra_config: dict[str, str] | None = None,
        heap: str = "256m",
    ) -> None:
        super().__init__(base_dir, port)
        self.myid = myid
        self.peers = list(peers)
        self.extra_config = dict(extra_config or {})
        self.heap = heap
        self.config_path = self.workdir / "zoo.cfg"
        self.log_path = self.console_path  # slf4j-simple logs to stderr

    def _log_files(self) -> list[Path]:
        return [self.console_path]

    def _config(self) -> str:
        lines = {
            "tickTime": "500",
            "initLimit": "10",
            "syncLimit": "5",
            "dataDir": str(self.data_dir),
            "clientPort": str(self.port),
            "clientPortAddress": HOST,
            "minSessionTimeout": "1000",
            "maxSessionTimeout": "60000",
            "maxClientCnxns": "0",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "ruok,srvr,stat,mntr,cons",
            "autopurge.purgeInterval": "0",
        }
        for peer in self.peers:
            lines[f"server.{peer.myid}"] = f"{HOST}:{peer.peer_port}:{peer.election_port}"
        lines.update(self.extra_config)
        return "".join(f"{key}={value}\n" for key, value in lines.items())

    def _prepare(self) -> None:
        super()._prepare()
        self.config_path.write_text(self._config())
        if self.peers:
            if self.myid is None:
                raise ServerError("an ensemble member needs a myid")
            (self.data_dir / "myid").write_text(f"{self.myid}\n")

    def _command(self) -> list[str]:
        classpath = zookeeper_classpath()
        if classpath is None:
            raise ServerError(f"{JAVA_DIR / 'zookeeper.jar'} not found")
        main = (
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            if self.peers
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        )
        return [
            _need("java"),
            f"-Xmx{self.heap}",
            *JVM_FLAGS,
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            main,
            str(self.config_path),
        ]

    def four_letter(self, word: str, timeout: float = 1.0) -> str:
        """Send a four-letter word (``srvr``, ``ruok``, ``stat``, ``mntr``, ``cons``).

        Raises OSError when the server does not answer within ``timeout``.
        """
        return _send_recv((HOST, self.port), word.encode(), timeout).decode("utf-8", "replace")

    def mode(self, timeout: float = 1.0) -> str | None:
        """``standalone``, ``leader`` or ``follower``; None when not serving."""
        try:
            answer = self.four_letter("srvr", timeout)
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.partition(":")[2].strip()
        return None

    def ping(self, timeout: float = 1.0) -> bool:
        return self.mode(timeout) is not None

    def cli(self, *args: str, timeout: float = 30.0, check: bool = True) -> str:
        """Run one ``zkCli`` command (``create /a x``, ``get /a``, ``ls /``) via ZooKeeperMain.

        Returns its output without the connection banner.  Starts a JVM: ~0.5 s.
        """
        return zookeeper_cli(self.address, *args, timeout=timeout, check=check)


_ZK_CLI_NOISE = ("Connecting to ", "WATCHER::", "WatchedEvent state:")


def zookeeper_cli(hosts: str, *args: str, timeout: float = 30.0, check: bool = True) -> str:
    """``zkCli.sh -server HOSTS ARGS...`` without the Debian wrapper."""
    classpath = zookeeper_classpath()
    if classpath is None:
        raise ServerError(f"{JAVA_DIR / 'zookeeper.jar'} not found")
    cmd = [
        _need("java"),
        "-Xmx64m",
        *JVM_FLAGS,
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath,
        "org.apache.zookeeper.ZooKeeperMain",
        "-server",
        hosts,
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise ServerError(
            f"zkCli {' '.join(args)} failed ({result.returncode}): "
            f"{(result.stdout + result.stderr).strip()}"
        )
    # zkCli prints errors such as "Node does not exist: /a" on stderr, among slf4j log lines
    errors = [line for line in result.stderr.splitlines() if not line.startswith("[")]
    lines = [
        line
        for line in [*result.stdout.splitlines(), *errors]
        if line.strip() and not line.startswith(_ZK_CLI_NOISE)
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# etcd
# --------------------------------------------------------------------------------------------


class EtcdServer(Server):
    """An etcd member with fast raft timings (heartbeat 20 ms, election 200 ms).

    Standalone by default; ``initial_cluster`` (``e1=http://127.0.0.1:P,...``) and ``name`` make
    it one member of a cluster.  A restart keeps the data dir, so etcd ignores the initial-cluster
    flags and rejoins.  Wiping one member of a multi-member cluster is refused (it would need a
    member remove/add); restart the whole ``EtcdCluster(wipe=True)`` instead.
    """

    kind = "etcd"
    scheme = "etcd"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        peer_port: int | None = None,
        name: str = "e1",
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(base_dir, port)
        self.peer_port = _reserve_port(peer_port) if peer_port is not None else free_port()
        self.name = name
        self._standalone = initial_cluster is None
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.cluster_token = cluster_token or f"aiodlock-{self.workdir.name}"
        self.extra_args = list(extra_args)

    @property
    def client_url(self) -> str:
        return f"http://{self.address}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"

    def _port_in_use(self) -> bool:
        # a cluster member's ports are in everybody's config: never change them silently
        return self._standalone and super()._port_in_use()

    def _on_port_change(self) -> None:
        self.peer_port = free_port()
        self.initial_cluster = f"{self.name}={self.peer_url}"

    def _command(self) -> list[str]:
        return [
            _need("etcd"),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.cluster_token,
            "--heartbeat-interval=20",
            "--election-timeout=200",
            "--logger", "zap",
            "--log-outputs", str(self.log_path),
            *self.extra_args,
        ]  # fmt: skip

    def _prepare(self) -> None:
        # etcd creates the data dir itself (mode 0700) and warns about an existing empty one.
        pass

    def ping(self, timeout: float = 0.5) -> bool:
        try:
            status, body = _http("GET", f"{self.client_url}/health", timeout=timeout)
            health = json.loads(body).get("health")
        except (OSError, ValueError, AttributeError):
            return False
        return status == 200 and health in (True, "true")

    def wipe(self) -> None:
        if not self._standalone:
            raise ServerError(
                "wiping one member of an etcd cluster is not supported; "
                "use EtcdCluster.restart(wipe=True)"
            )
        super().wipe()
        self.cluster_token = f"aiodlock-{self.workdir.name}-{self.starts}"

    def status(self, timeout: float = 1.0) -> dict[str, object]:
        """``/v3/maintenance/status`` (JSON gateway): member_id, leader, raftTerm, ..."""
        _, body = _http("POST", f"{self.client_url}/v3/maintenance/status", b"{}", timeout)
        result: dict[str, object] = json.loads(body)
        return result

    def is_leader(self, timeout: float = 1.0) -> bool:
        try:
            status = self.status(timeout)
        except (OSError, ValueError):
            return False
        header = status.get("header")
        return isinstance(header, dict) and header.get("member_id") == status.get("leader")

    def cli(self, *args: str, timeout: float = 10.0, check: bool = True) -> str:
        """``etcdctl --endpoints=http://127.0.0.1:PORT ARGS...`` (API v3); stdout stripped."""
        return etcdctl([self.client_url], *args, timeout=timeout, check=check)


def etcdctl(endpoints: Sequence[str], *args: str, timeout: float = 10.0, check: bool = True) -> str:
    env = {**os.environ, "ETCDCTL_API": "3"}
    cmd = [_need("etcdctl"), f"--endpoints={','.join(endpoints)}", "--dial-timeout=2s", *args]
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if check and result.returncode != 0:
        raise ServerError(f"etcdctl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


class _Template:
    """A data directory made once per process by a program (``mariadb-install-db``,
    ``initdb``: about a second), then copied for every server: ``datadir()``."""

    def __init__(self, program: str, command: Callable[[Path], list[str]]) -> None:
        self.program = program
        self._command = command  # (given the new root, prepares it; the program's command)
        self._lock = threading.Lock()
        self._datadir: Path | None = None

    def datadir(self) -> Path:
        with self._lock:
            if self._datadir is not None and self._datadir.is_dir():
                return self._datadir
            root = Path(tempfile.mkdtemp(prefix=f"aiodlock-{self.program}-template-"))
            atexit.register(shutil.rmtree, root, True)
            cmd = self._command(root)
            log = root / "install.log"
            with open(log, "wb") as out:
                result = subprocess.run(
                    cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, timeout=120, check=False
                )
            if result.returncode != 0:
                raise ServerError(f"{self.program} failed ({result.returncode})\n{_tail(log)}")
            self._datadir = root / "data"
            return self._datadir


class _SQLServer(Server):
    """A database server: the tests' database on it (``default_database`` unless given) and
    extra command-line arguments."""

    default_database: ClassVar[str]

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        port: int | None = None,
        *,
        database: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(base_dir, port)
        self.database = database or self.default_database
        self.extra_args = list(extra_args)
        self._place_files()

    def _place_files(self) -> None:
        """Where the server's own files go (its socket, its data), set once."""


def _sql_rows(cmd: list[str], statement: str, timeout: float) -> list[tuple[str, ...]]:
    """Run a database's command-line client; its tab-separated output as rows of strings.
    Raises ServerError on an SQL error."""
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise ServerError(f"SQL failed: {statement!r}: {result.stderr.strip()}")
    return [tuple(line.split("\t")) for line in result.stdout.splitlines()]


# --------------------------------------------------------------------------------------------
# MariaDB
# --------------------------------------------------------------------------------------------

_MARIADB_INNODB_ARGS = (
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",
)


def _user_args() -> list[str]:
    if os.geteuid() == 0:
        return ["--user=root"]
    return []


def _install_mariadb_datadir(root: Path) -> list[str]:
    user = ["--user=root"] if os.geteuid() == 0 else [f"--user={_current_user()}"]
    return [
        _need("mariadb-install-db"),
        "--no-defaults",
        f"--datadir={root / 'data'}",
        *user,
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--skip-name-resolve",
        *_MARIADB_INNODB_ARGS,
    ]


#: A datadir made by ``mariadb-install-db`` once per process (~0.9 s), copied per server.
_mariadb_template = _Template("mariadb-install-db", _install_mariadb_datadir)


def _current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


class MariaDBServer(_SQLServer):
    """``mariadbd`` on a fresh datadir; root without password on TCP and on its Unix socket.

    The database ``aiodlock_test`` is created after every start (``CREATE ... IF NOT EXISTS``).
    """

    kind = "mariadb"
    scheme = "mysql"
    user = "root"
    password = ""

    default_database = "aiodlock_test"

    def _place_files(self) -> None:
        socket_dir = _short_dir(self.workdir, "mysqld.sock", "adl-mariadb-")
        if socket_dir != self.workdir:
            self._extra_cleanup.append(socket_dir)
        self.socket_path = socket_dir / "mysqld.sock"
        self.pid_file = self.workdir / "mysqld.pid"

    @property
    def url(self) -> str:
        return f"mysql://{self.user}@{self.address}/{self.database}"

    def _prepare(self) -> None:
        if not self.data_dir.exists():
            shutil.copytree(_mariadb_template.datadir(), self.data_dir, symlinks=True)

    def _command(self) -> list[str]:
        return [
            _need("mariadbd"),
            "--no-defaults",  # must come first
            *_user_args(),
            f"--datadir={self.data_dir}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.pid_file}",
            f"--bind-address={HOST}",
            f"--port={self.port}",
            "--skip-name-resolve",
            f"--log-error={self.log_path}",
            *_MARIADB_INNODB_ARGS,
            "--skip-log-bin",
            "--performance-schema=OFF",
            *self.extra_args,
        ]

    def ping(self, timeout: float = 0.5) -> bool:
        """A protocol-10 handshake packet arrives on TCP."""
        try:
            with socket.create_connection((HOST, self.port), timeout=timeout) as sock:
                sock.settimeout(timeout)
                header = b""
                while len(header) < 5:
                    chunk = sock.recv(5 - len(header))
                    if not chunk:
                        return False
                    header += chunk
        except OSError:
            return False
        return header[4] == 0x0A

    def _after_ready(self) -> None:
        self.sql(f"CREATE DATABASE IF NOT EXISTS `{self.database}`", database=None)

    def sql(
        self, statement: str, *, database: str | None = "", timeout: float = 30.0
    ) -> list[tuple[str, ...]]:
        """Run SQL with the ``mariadb`` client over the Unix socket; rows as tuples of strings.

        ``database=""`` means ``self.database``; None means no default database.  NULL comes
        back as the string ``NULL``.  Raises ServerError on an SQL error.
        """
        db = self.database if database == "" else database
        cmd = [
            _need("mariadb"),
            "--no-defaults",
            f"--socket={self.socket_path}",
            f"--user={self.user}",
            "--batch",
            "--skip-column-names",
            "--raw",
            "-e",
            statement,
        ]
        return _sql_rows(cmd + ([db] if db else []), statement, timeout)


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------

#: initdb and postgres refuse to run as root ("cannot be run as root"); as root, both run as
#: this system user (the Debian package creates it) through ``setpriv``, which execs (no
#: intermediate process: the pid is the postmaster's), in directories that user owns.
POSTGRES_OS_USER = "postgres"


def _as_postgres_user() -> list[str]:
    """The prefix that runs a PostgreSQL program as a non-root user ([] when not root)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(POSTGRES_OS_USER)
    except KeyError:
        raise ServerError(
            f"running as root and there is no {POSTGRES_OS_USER!r} user for initdb/postgres "
            "(they refuse to run as root; scripts/install-servers creates it)"
        ) from None
    return [_need("setpriv"), f"--reuid={POSTGRES_OS_USER}", f"--regid={POSTGRES_OS_USER}",
            "--init-groups", "--"]  # fmt: skip


def _give_to_postgres_user(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(POSTGRES_OS_USER)
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.lchown(name, entry.pw_uid, entry.pw_gid)


def _init_postgres_datadir(root: Path) -> list[str]:
    # (not under pytest's private tmp dir: the postgres user could not reach it)
    os.chmod(root, 0o755)
    pwfile = root / "pw"
    pwfile.write_text(PostgresServer.password + "\n")
    _give_to_postgres_user(root)
    return [
        *_as_postgres_user(),
        _need("initdb"),
        f"--pgdata={root / 'data'}",
        f"--username={PostgresServer.user}",
        f"--pwfile={pwfile}",
        "--auth-local=trust",  # the test helpers' psql on the Unix socket
        "--auth-host=scram-sha-256",  # TCP needs the password: a wrong one is refused
        "--encoding=UTF8",
        "--no-sync",
    ]


#: A cluster made by ``initdb`` once per process (~1 s), copied per server.
_postgres_template = _Template("initdb", _init_postgres_datadir)


class PostgresServer(_SQLServer):
    """``postgres`` on a copy of a fresh cluster, on a loopback port, with its Unix socket in a
    private directory (never the machine's own service on 5432).  TCP connections need the
    password (scram-sha-256), the Unix socket trusts.  As root, the server runs as the
    ``postgres`` system user (see :data:`POSTGRES_OS_USER`); its files live in a directory
    under /tmp that user owns.  ``stop()`` is a fast shutdown (SIGINT): SIGTERM would wait
    for every client to disconnect."""

    kind = "postgres"
    scheme = "postgresql"
    user = "postgres"
    password = "aiodlock-test-pw"

    default_database = "postgres"

    def _place_files(self) -> None:
        # The data and the socket in a short directory the server's user can reach.
        self.home = Path(tempfile.mkdtemp(prefix="adl-pg-"))
        os.chmod(self.home, 0o755)
        self._extra_cleanup.append(self.home)
        self.data_dir = self.home / "data"
        self.socket_dir = self.home

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.address}/{self.database}"

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / f".s.PGSQL.{self.port}"

    def _prepare(self) -> None:
        if not self.data_dir.exists():
            subprocess.run(
                ["cp", "-a", str(_postgres_template.datadir()), str(self.data_dir)], check=True
            )
            _give_to_postgres_user(self.home)

    def _command(self) -> list[str]:
        return [
            *_as_postgres_user(),
            _need("postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-k", str(self.socket_dir),
            "-c", f"listen_addresses={HOST}",
            "-c", "fsync=off",  # tests only
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=200",
            "-c", "logging_collector=off",
            *self.extra_args,
        ]  # fmt: skip

    def ping(self, timeout: float = 0.5) -> bool:
        """A startup packet on the Unix socket is answered by an authentication request."""
        params = f"user\0{self.user}\0database\0postgres\0\0".encode()
        packet = (8 + len(params)).to_bytes(4, "big") + (196608).to_bytes(4, "big") + params
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(str(self.socket_path))
                sock.sendall(packet)
                first = sock.recv(1)
                if first == b"R":
                    with contextlib.suppress(OSError):
                        sock.sendall(b"X\0\0\0\4")  # Terminate
        except OSError:
            return False
        return first == b"R"

    def _children(self) -> list[int]:
        """The postmaster's children (each backend calls setsid(): it is in a process group
        of its own, which a signal to the postmaster's group does not reach)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == proc.pid:
                found.append(int(entry.name))
        return found

    def _signal_children(self, sig: signal.Signals) -> None:
        for pid in self._children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: nothing answers any more."""
        super().pause()
        self._signal_children(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_children(signal.SIGCONT)
        super().resume()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (a crash: every session ends at once)."""
        self._signal_children(signal.SIGKILL)
        super().kill()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Fast shutdown (SIGINT: sessions are ended), then SIGKILL after ``timeout``."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            _signal(proc, signal.SIGCONT)
            self._signal_children(signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)  # the postmaster only, not its children
        super().stop(timeout)

    def backend_pids(self, application_name: str | None = None) -> list[int]:
        """The server processes of client sessions (optionally of one application)."""
        where = "backend_type = 'client backend' AND pid <> pg_backend_pid()"
        if application_name is not None:
            where += f" AND application_name = '{application_name}'"
        return [int(row[0]) for row in self.sql(f"SELECT pid FROM pg_stat_activity WHERE {where}")]

    def sql(self, statement: str, *, timeout: float = 30.0) -> list[tuple[str, ...]]:
        """Run SQL with ``psql`` on the Unix socket; rows as tuples of strings (NULL: '')."""
        cmd = [
            _need("psql"), "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
            "-h", str(self.socket_dir), "-p", str(self.port), "-U", self.user,
            "-d", self.database, "-c", statement,
        ]  # fmt: skip
        return _sql_rows(cmd, statement, timeout)


# --------------------------------------------------------------------------------------------
# groups: Redlock masters, ZooKeeper ensemble, etcd cluster
# --------------------------------------------------------------------------------------------

S = TypeVar("S", bound=Server)


class ServerGroup(Generic[S]):
    """Several servers started together (all spawned first, then all waited for)."""

    def __init__(self, members: Sequence[S]) -> None:
        self.members: list[S] = list(members)

    def __iter__(self) -> Iterator[S]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> S:
        return self.members[index]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.members!r}>"

    @property
    def ports(self) -> list[int]:
        return [member.port for member in self.members]

    @property
    def hosts(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...``"""
        return ",".join(member.address for member in self.members)

    @property
    def urls(self) -> list[str]:
        return [member.url for member in self.members]

    def running_members(self) -> list[S]:
        return [member for member in self.members if member.running]

    def start(self, timeout: float = READY_TIMEOUT) -> Self:
        """Spawn every member that is not running, then wait until all answer."""
        try:
            for member in self.members:
                if not member.running:
                    member.spawn()
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        for member in self.members:
            if member.running:
                member.wait_ready(max(0.1, deadline - time.monotonic()))

    def stop(self) -> None:
        """Stop the members one after the other.

        (SIGTERM to all etcd members at once costs ~5 s: each one tries to hand over
        leadership to peers that are going away.)
        """
        for member in self.members:
            member.stop()

    def kill(self) -> None:
        for member in self.members:
            member.kill()

    def restart(self, *, wipe: bool = False, timeout: float = READY_TIMEOUT) -> Self:
        self.stop()
        if wipe:
            self._wipe()
        return self.start(timeout)

    def _wipe(self) -> None:
        for member in self.members:
            member.wipe()

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisGroup(ServerGroup[RedisServer]):
    """``n`` independent Redis masters (for Redlock)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        n: int,
        *,
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            [RedisServer(base_dir, password=password, extra_args=extra_args) for _ in range(n)]
        )


def start_many_redis(
    n: int,
    base_dir: str | os.PathLike[str],
    *,
    password: str | None = None,
    extra_args: Sequence[str] = (),
) -> RedisGroup:
    """Start ``n`` independent Redis masters concurrently."""
    return RedisGroup(base_dir, n, password=password, extra_args=extra_args).start()


class ZooKeeperEnsemble(ServerGroup[ZooKeeperServer]):
    """A ZooKeeper quorum on loopback; ``url`` is ``zookeeper://h:p1,h:p2,h:p3``.

    Each member is a ZooKeeperServer: kill/pause/restart them one by one.
    """

    def __init__(
        self, base_dir: str | os.PathLike[str], size: int = 3, *, heap: str = "128m"
    ) -> None:
        if size < 1:
            raise ValueError("an ensemble needs at least one member")
        peers = [
            ZooKeeperPeer(myid, free_port(), free_port(), free_port())
            for myid in range(1, size + 1)
        ]
        super().__init__(
            [
                ZooKeeperServer(base_dir, peer.client_port, myid=peer.myid, peers=peers, heap=heap)
                for peer in peers
            ]
        )
        self.peers = peers

    @property
    def url(self) -> str:
        return f"zookeeper://{self.hosts}"

    def leader(self, timeout: float = 10.0) -> ZooKeeperServer:
        """The member whose ``srvr`` says ``Mode: leader`` (waits up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self.running_members():
                if not member.paused and member.mode(timeout=0.5) == "leader":
                    return member
            if time.monotonic() > deadline:
                raise ServerError(f"no ZooKeeper leader among {self.members!r}")
            time.sleep(0.05)

    def followers(self) -> list[ZooKeeperServer]:
        return [m for m in self.running_members() if m.mode(timeout=0.5) == "follower"]

    def cli(self, *args: str, timeout: float = 30.0, check: bool = True) -> str:
        """zkCli against the running members."""
        hosts = ",".join(m.address for m in self.running_members() if not m.paused)
        return zookeeper_cli(hosts, *args, timeout=timeout, check=check)


class EtcdCluster(ServerGroup[EtcdServer]):
    """An etcd cluster on loopback; ``url`` is ``etcd://h:p1,h:p2,h:p3``.

    Members can be killed and restarted one by one (their data dir is kept).  ``restart()`` of
    the whole cluster waits for every old member to exit first; ``restart(wipe=True)`` wipes all
    data dirs and bootstraps a new cluster with a new token (drivers.md pitfall 6).
    """

    def __init__(self, base_dir: str | os.PathLike[str], size: int = 3) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one member")
        ports = [(free_port(), free_port()) for _ in range(size)]
        initial = ",".join(f"e{i}=http://{HOST}:{peer}" for i, (_, peer) in enumerate(ports, 1))
        self._generation = 0
        self._token = f"aiodlock-{os.getpid()}-{ports[0][1]}"
        super().__init__(
            [
                EtcdServer(
                    base_dir,
                    client,
                    peer_port=peer,
                    name=f"e{i}",
                    initial_cluster=initial,
                    cluster_token=self._token,
                )
                for i, (client, peer) in enumerate(ports, 1)
            ]
        )

    @property
    def url(self) -> str:
        return f"etcd://{self.hosts}"

    @property
    def endpoints(self) -> list[str]:
        return [member.client_url for member in self.members]

    def _wipe(self) -> None:
        self._generation += 1
        for member in self.members:
            shutil.rmtree(member.data_dir, ignore_errors=True)
            member.cluster_token = f"{self._token}-{self._generation}"

    def leader(self, timeout: float = 10.0) -> EtcdServer:
        deadline = time.monotonic() + timeout
        while True:
            for member in self.running_members():
                if not member.paused and member.is_leader(timeout=0.5):
                    return member
            if time.monotonic() > deadline:
                raise ServerError(f"no etcd leader among {self.members!r}")
            time.sleep(0.02)

    def cli(self, *args: str, timeout: float = 10.0, check: bool = True) -> str:
        """etcdctl against the running members (etcdctl does not retry a put elsewhere)."""
        endpoints = [m.client_url for m in self.running_members() if not m.paused]
        return etcdctl(endpoints or self.endpoints, *args, timeout=timeout, check=check)


# --------------------------------------------------------------------------------------------
# Redis Sentinel and Cluster deployments
# --------------------------------------------------------------------------------------------


class SentinelDeployment:
    """A master, one replica and three sentinels (quorum 2) on loopback."""

    service: ClassVar[str] = "mymaster"

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
                f"sentinel monitor {self.service} {HOST} {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 5000\n"
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
        return f"redis+sentinel://{hosts}/{self.service}"

    def master_port(self) -> int:
        """The master port as the first live sentinel reports it."""
        for sentinel in self.sentinels:
            if sentinel.running and not sentinel.paused:
                out = sentinel.cli("SENTINEL", "get-master-addr-by-name", self.service, check=False)
                lines = out.split()
                if len(lines) == 2:
                    return int(lines[1])
        raise ServerError("no sentinel answered")

    def describe(self) -> str:
        """What each member says now (for a failure's message): the data servers' roles,
        where each sentinel says the master is."""
        lines = []
        for name, server in (("master", self.master), ("replica", self.replica)):
            if server is None:
                continue
            role = "not running"
            if server.running:
                info = server.cli("INFO", "replication", check=False)
                role = next((x for x in info.splitlines() if x.startswith("role:")), info[:80])
            lines.append(f"{name} (as started) {server.port}: {role.strip()}")
        ask = ("SENTINEL", "get-master-addr-by-name", self.service)
        for sentinel in self.sentinels:
            said = sentinel.cli(*ask, check=False) if sentinel.running else "not running"
            lines.append(f"sentinel {sentinel.port}: names {' '.join(said.split()) or '?'}")
        return "\n".join(lines)

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
                replicas = sentinel.cli("SENTINEL", "replicas", self.service, check=False)
                others = sentinel.cli("SENTINEL", "sentinels", self.service, check=False)
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
            command = [_need("redis-cli"), "--cluster", "create", *addresses]
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
                [_need("redis-cli"), "-h", HOST, "-p", str(master.port)],
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
            if binascii.crc_hqx(f"probe{i}".encode(), 0) % 16384 in slots:  # its slot
                return f"probe{i}"
        raise AssertionError("unreachable")

    def close(self) -> None:
        for node in [*self.replicas, *self.nodes]:
            with contextlib.suppress(Exception):
                node.close()
