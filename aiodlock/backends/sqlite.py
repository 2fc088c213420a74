"""``sqlite:///path``: locks shared by every process of one host through one SQLite file.

The embedded default of :func:`aiodlock.connect`.  The algorithm is the lock table of
:mod:`aiodlock.backends._sql`; this module adds the SQLite dialect and the connection:
stdlib :mod:`sqlite3`, one connection per backend, used by one worker thread at a time, in
WAL mode, every write a ``BEGIN IMMEDIATE`` transaction (atomic across processes).  A waiter
polls with capped, jittered backoff (nothing tells another process that a row went), and a
release in THIS process wakes a local waiter at once through the wake-up board that the
backends of one event loop share per database file.  See ``docs/backends/sqlite.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any, Self, TypeVar

import anyio
import anyio.to_thread

from .._errors import BackendError, BackendTimeout, ConfigurationError, translating
from .._types import (
    Capability,
    CommonConfig,
    LostCallback,
    monotonic,
)
from .._url import ParsedURL, sqlite_url, take_float, take_str
from ._sql import Dialect, LockTable, Script, run_script
from ._sql_backend import LockTableBackend, MakeScript

__all__ = ["SQLiteBackend", "SQLiteDialect"]

T = TypeVar("T")

log = logging.getLogger("aiodlock")

#: How long SQLite's own busy handler waits before our retry loop looks at the deadline
#: and at cancellation again (``sqlite3.interrupt()`` does not stop a busy wait).
_BUSY_SLICE = 0.05
_SYNCHRONOUS = ("off", "normal", "full", "extra")


class SQLiteDialect(Dialect):
    name = "sqlite"
    placeholder = "?"
    for_update = ""  # BEGIN IMMEDIATE already holds the database's single write lock
    now_sql = None  # every process on the file shares the host's wall clock

    # (a duplicate key would abort nothing here, but raise: 0 rows inserted instead)
    insert_suffix = " ON CONFLICT DO NOTHING"

    def create_tables(self, locks: str) -> list[str]:
        # (AUTOINCREMENT: an id is never reused, even the largest one after its row goes:
        # sqlite_sequence keeps the last one)
        return [
            f"CREATE TABLE IF NOT EXISTS {locks} ("
            " token INTEGER PRIMARY KEY AUTOINCREMENT,"
            " namespace TEXT NOT NULL,"
            " name BLOB NOT NULL,"
            " owner TEXT NOT NULL,"
            " expires_at INTEGER NOT NULL,"
            " version INTEGER NOT NULL,"
            " waiting INTEGER NOT NULL DEFAULT 0,"
            " UNIQUE (namespace, name))",
            f"CREATE INDEX IF NOT EXISTS {locks}_expiry ON {locks} (expires_at)",
        ]

    def create_line(self, line: str) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {line} ("
            " id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " namespace TEXT NOT NULL,"
            " name BLOB NOT NULL,"
            " owner TEXT NOT NULL,"
            " expires_at INTEGER NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {line}_order ON {line} (namespace, name, id)",
            f"CREATE INDEX IF NOT EXISTS {line}_expiry ON {line} (expires_at)",
        ]

    def sweep_expired(self, table: str, where: str = "") -> str:
        # DELETE ... LIMIT needs a compile-time option; go through the rowid instead.
        return (
            f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table}"
            f" WHERE expires_at < ? {where} LIMIT {int(self.sweep_limit)})"
        )


SQLITE = SQLiteDialect()


@dataclasses.dataclass(slots=True)
class _Job:
    """One call on the connection, run by a worker thread."""

    fn: Callable[[sqlite3.Connection, _Job], Any]
    deadline: float
    cancelled: bool = False  # set from the event loop when the caller gives up


Body = Callable[[sqlite3.Connection, _Job], T]


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _while_busy(conn: sqlite3.Connection, job: _Job, run: Callable[[], T]) -> T:
    """``run()``, rolled back and run again while the database is busy, until the job ends.

    A transaction that failed with SQLITE_BUSY has not committed (a busy COMMIT leaves it
    open and we roll it back), so running it again is safe.
    """
    while True:
        try:
            return run()
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            busy = isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)
            if not busy or job.cancelled or monotonic() >= job.deadline:
                raise


def _transaction(make_script: Callable[[], Script[T]], *, write: bool) -> Body[T]:
    """A job body running a script in one transaction (a write one: ``BEGIN IMMEDIATE``)."""

    def run(conn: sqlite3.Connection) -> T:
        if write:
            conn.execute("BEGIN IMMEDIATE")
        result = run_script(conn.execute, make_script())
        if write:
            conn.execute("COMMIT")
        return result

    return lambda conn, job: _while_busy(conn, job, lambda: run(conn))


def _read_first(read: Callable[[], Script[T | None]], write: Callable[[], Script[T]]) -> Body[T]:
    """Run ``read``, and ``write`` only if the read did not answer (returned ``None``).

    A read never takes the write lock (WAL: it never blocks and is never blocked), so a
    poll that finds a live holder, or a clean-up that finds nothing, costs no write.
    """
    first, then = _transaction(read, write=False), _transaction(write, write=True)

    def body(conn: sqlite3.Connection, job: _Job) -> T:
        answer = first(conn, job)
        return then(conn, job) if answer is None else answer

    return body


def _nothing(conn: sqlite3.Connection, job: _Job) -> None:
    return None


class SQLiteBackend(LockTableBackend):
    """Locks in one SQLite file shared by the processes of one host."""

    backend_name = "sqlite"
    capabilities = (
        Capability.FENCING | Capability.CROSS_PROCESS | Capability.FAIR | Capability.URGENT
    )

    def __init__(
        self,
        path: str,
        config: CommonConfig,
        *,
        busy_timeout: float | None = None,
        poll_min: float = 0.005,
        poll_max: float = 0.1,
        synchronous: str = "full",
    ) -> None:
        if synchronous.lower() not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"option 'synchronous' must be one of {', '.join(_SYNCHRONOUS)}, "
                f"got {synchronous!r}"
            )
        if not 0 < poll_min <= poll_max:
            raise ConfigurationError(
                f"options 'poll_min' and 'poll_max' need 0 < poll_min <= poll_max, "
                f"got {poll_min} and {poll_max}"
            )
        self.path = os.path.abspath(path)
        self.config = config
        #: Seconds a call waits for another connection's write lock before BackendTimeout.
        self.busy_timeout = min(busy_timeout or config.op_timeout, config.op_timeout)
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.synchronous = synchronous.lower()
        self.table = LockTable(SQLITE, config.namespace)
        self._conn: sqlite3.Connection | None = None
        self._thread_lock = threading.Lock()
        self._gate: anyio.Lock | None = None

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        if url.hosts or url.username is not None or url.password is not None:
            raise ConfigurationError(
                "a sqlite URL has no host: use 'sqlite:///relative/path.db' or "
                "'sqlite:////absolute/path.db' (three slashes, then the path)"
            )
        # "sqlite:///x.db" -> "x.db" (relative), "sqlite:////abs/x.db" -> "/abs/x.db" (SQLAlchemy's)
        path = url.path[1:] if url.path.startswith("/") else url.path
        # A path with "?" or "#" cannot be written in the URL's path: the option ``path``
        # (percent-decoded, as every query value) takes any path.
        option = take_str(options, "path", None)
        if option is not None:
            if path:
                raise ConfigurationError(
                    "a sqlite URL gives its file either in the URL's path or in the option "
                    "'path', not both"
                )
            path = option
        if not path or path.endswith("/"):
            raise ConfigurationError(
                "a sqlite URL needs a file path: 'sqlite:///relative/path.db' or "
                "'sqlite:////absolute/path.db'"
            )
        if path == ":memory:":
            raise ConfigurationError(
                "sqlite:///:memory: cannot be shared: an in-memory database is private to "
                "one connection; use 'memory://' for locks inside one process, or a file path"
            )
        if path.startswith("file:"):
            raise ConfigurationError(
                "SQLite URI filenames ('file:...') are not supported in a sqlite URL; "
                "give a file path: 'sqlite:///relative/path.db' or 'sqlite:////absolute/path.db'"
            )
        return cls(
            path,
            config,
            busy_timeout=take_float(options, "busy_timeout", None, allow_zero=False),
            poll_min=take_float(options, "poll_min", 0.005, allow_zero=False),
            poll_max=take_float(options, "poll_max", 0.1, allow_zero=False),
            synchronous=take_str(options, "synchronous", "full") or "full",
        )

    def describe(self) -> str:
        return sqlite_url(self.path)

    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        """The one place sqlite3's exceptions become BackendError / BackendTimeout."""
        with translating(self.backend_name, (sqlite3.Error,), what=what):
            try:
                yield
            except sqlite3.Error as exc:
                if _is_busy(exc):
                    raise BackendTimeout(
                        f"sqlite: {what} timed out: the database stayed locked by another "
                        f"connection for {self.busy_timeout:g} s (busy_timeout)"
                    ) from exc
                raise

    def _work(self, job: _Job) -> Any:
        # Runs in a worker thread.
        with self._thread_lock:
            if job.cancelled:
                return None  # its caller gave up before it started: no effect at all
            if self._conn is None:
                raise sqlite3.ProgrammingError("the backend is closed")
            return job.fn(self._conn, job)

    async def _call(self, fn: Body[T], what: str) -> T:
        """Run ``fn(conn, job)`` in a worker thread, bounded by ``op_timeout``.

        Calls of one backend run one after another (``_gate``).  A caller that is cancelled
        or times out does not wait for the thread: the job is marked so that it never
        starts if it has not, and a job already running keeps ``_thread_lock`` until it
        ends, so every later call (e.g. the core's ``abandon`` after a cancelled attempt)
        still sees its effects in order.
        """
        if self._gate is None:
            raise BackendError("sqlite: the backend is not open")
        with self._translate(what), anyio.fail_after(self.config.op_timeout):
            async with self._gate:
                job = _Job(fn, monotonic() + self.busy_timeout)
                try:
                    result: T = await anyio.to_thread.run_sync(
                        self._work, job, abandon_on_cancel=True
                    )
                except BaseException:
                    job.cancelled = True
                    raise
                return result

    async def _run(self, what: str, read: MakeScript | None, write: MakeScript | None) -> Any:
        if read is None:
            body: Body[Any] = _transaction(write, write=True) if write else _nothing
        elif write is None:
            body = _transaction(read, write=False)
        else:
            body = _read_first(read, write)
        return await self._call(body, what)

    def _connect(self) -> sqlite3.Connection:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            links = os.stat(self.path).st_nlink
            if links > 1:
                # NOTE: each link name gets a -wal/-shm pair of its own, so processes that
                # open the file by different names do not see each other's locks (SQLite's
                # "How To Corrupt" page lists this).  A symlink is fine: it resolves to one.
                raise ConfigurationError(
                    f"sqlite: {self.path} has {links} hard links; processes that open it by "
                    f"different names would not exclude each other: use one path (a symlink "
                    f"is fine), and mount its directory, not the single file, into a container"
                )
        conn = sqlite3.connect(
            self.path,
            timeout=_BUSY_SLICE,
            isolation_level=None,  # autocommit: we issue BEGIN IMMEDIATE / COMMIT ourselves
            check_same_thread=False,  # used by one worker thread at a time (_thread_lock)
        )
        try:
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _setup(self, conn: sqlite3.Connection, job: _Job) -> tuple[str, tuple[int, int]]:
        def run() -> str:
            # WAL: readers (polls, status) never block the writer and vice versa.  It is
            # persistent in the file; changing it needs a moment of exclusive access, hence
            # the busy retry when several processes open a new file at once.
            mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            conn.executescript(";".join(["BEGIN IMMEDIATE", *self.table.schema(), "COMMIT"]))
            return mode.lower()

        mode = _while_busy(conn, job, run)
        st = os.stat(self.path)
        return mode, (st.st_dev, st.st_ino)

    async def open(self, on_lost: LostCallback) -> None:
        if self._conn is not None:
            return
        with self._translate("open"):
            self._conn = await anyio.to_thread.run_sync(self._connect)
        self._gate = anyio.Lock()
        mode, file_id = await self._call(self._setup, "open")
        if mode != "wal":
            # Still correct (BEGIN IMMEDIATE serialises writers), but polls now block writers.
            log.warning(
                "aiodlock: %s is in journal mode %r, not WAL (unsupported file system?)",
                self.describe(),
                mode,
            )
        self._join_board(("sqlite", file_id))

    async def aclose(self) -> None:
        self._leave_board()
        conn, self._conn = self._conn, None
        if conn is None:
            return

        def close() -> None:
            with self._thread_lock:  # after any job still running on it
                conn.close()

        with self._translate("close"):
            await anyio.to_thread.run_sync(close, abandon_on_cancel=True)
