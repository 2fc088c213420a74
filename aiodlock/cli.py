"""The ``aiodlock`` command line (also ``python -m aiodlock``).

Commands::

    aiodlock run NAME [--timeout S] [--ttl S] [--grace S] -- COMMAND [ARGS...]
    aiodlock status NAME [--json]
    aiodlock release NAME --force
    aiodlock demo [--workers N] [--duration S | --rounds N] [--json]

The lock service is ``--url`` (before or after the command), else ``AIODLOCK_URL``, else
the embedded default (:func:`aiodlock.default_url`: a SQLite file in the user cache dir).

Exit statuses (see ``docs/cli.md``): ``run`` passes the command's status through (128+N
when it died of signal N); 75 (EX_TEMPFAIL) when the lock was not acquired in time; 70
(EX_SOFTWARE) when the lease was lost while the command ran; 126/127 when the command could
not be started; 2 for usage and configuration errors; 69 (EX_UNAVAILABLE) when the lock
service failed or could not be reached.  ``status`` exits 0 when the lock is held and 1 when
it is free; ``release --force`` exits 0 when it broke a lock and 1 when there was none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, NoReturn

import anyio

from . import __version__
from ._client import Client, connect, default_url
from ._errors import (
    BackendError,
    ConfigurationError,
    LockError,
    LockLost,
    LockTimeout,
    Unsupported,
)
from ._lease import Lease, LockStatus
from ._lock import Lock
from ._url import parse_url
from .backends._base import Capability

__all__ = [
    "EX_COMMAND_NOT_FOUND",
    "EX_CONFIG",
    "EX_FREE",
    "EX_LOST",
    "EX_NOT_EXECUTABLE",
    "EX_OK",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "build_parser",
    "main",
]

log = logging.getLogger("aiodlock.cli")

EX_OK = 0
#: ``status``: the lock is free; ``release --force``: there was nothing to release; ``demo``:
#: an overlap or a token out of order was seen.
EX_FREE = 1
#: Usage or configuration error (bad option, bad URL, unknown scheme, missing extra).
EX_CONFIG = 2
#: The lock service failed or could not be reached (BSD sysexits EX_UNAVAILABLE).
EX_UNAVAILABLE = 69
#: ``run``: the lease was lost while the command ran; the command was stopped (EX_SOFTWARE).
EX_LOST = 70
#: ``run``: the lock was not acquired within ``--timeout``; the command did not run.
EX_TEMPFAIL = 75
#: ``run``: the command exists but could not be executed (as in a POSIX shell).
EX_NOT_EXECUTABLE = 126
#: ``run``: the command was not found (as in a POSIX shell).
EX_COMMAND_NOT_FOUND = 127

DEMO_NAMESPACE = "aiodlock-demo"
DEMO_LOCK = "aiodlock-demo"

# Put on the demo workers' PYTHONPATH so they import this very copy of aiodlock.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Exit(Exception):
    """Leave with a status after printing ``message`` on stderr."""

    def __init__(self, status: int, message: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _say(message: str) -> None:
    print(f"aiodlock: {message}", file=sys.stderr, flush=True)


# -- argument parsing ---------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors exit with :data:`EX_CONFIG`."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_CONFIG, f"{self.prog}: error: {message}\n")


_DESCRIPTION = """\
Distributed locks from the shell.

The lock service is --url (accepted before or after the command), else the
environment variable AIODLOCK_URL, else the embedded default: a SQLite file in
the user cache dir ($XDG_CACHE_HOME/aiodlock/locks.db), shared by every process
of this host. Examples of URLs: redis://127.0.0.1:6379/0,
zookeeper://zk1:2181,zk2:2181/app, etcd://127.0.0.1:2379,
sqlite:////var/lock/app.db, mysql://user:pw@db:3306/app.
"""

_EPILOG = """\
examples:
  aiodlock run nightly-backup -- /usr/local/bin/backup.sh --full
  aiodlock run --timeout 0 cron:report -- python report.py   # skip if running
  aiodlock --url redis://10.0.0.5:6379/0 status nightly-backup
  aiodlock release nightly-backup --force
  aiodlock demo --workers 8

exit statuses: run passes the command's status through; 75 lock not acquired
in time; 70 lease lost while the command ran; 2 usage or configuration error;
69 lock service unavailable. See `aiodlock COMMAND --help` and docs/cli.md.
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``aiodlock`` command."""
    common = _Parser(add_help=False)
    group = common.add_argument_group("lock service")
    group.add_argument(
        "--url",
        dest="sub_url",
        metavar="URL",
        help="lock service URL (default: $AIODLOCK_URL, else the embedded SQLite file)",
    )
    group.add_argument(
        "--namespace",
        dest="sub_namespace",
        metavar="NS",
        help="key prefix that separates applications on one server (default: aiodlock)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        dest="sub_verbose",
        action="store_true",
        default=None,
        help="say what happens (acquired, released, tokens) on stderr",
    )

    parser = _Parser(
        prog="aiodlock",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aiodlock {__version__}")
    parser.add_argument("--url", metavar="URL", help="lock service URL (see above)")
    parser.add_argument(
        "--namespace", metavar="NS", help="key prefix of every lock (default: aiodlock)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="say what happens")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", parser_class=_Parser
    )
    commands.required = True

    run = commands.add_parser(
        "run",
        parents=[common],
        usage="aiodlock run [options] NAME -- COMMAND [ARGS...]",
        help="run a command while holding a lock (like flock(1), across hosts)",
        description=(
            "Acquire the lock NAME, run COMMAND while holding it, release it when COMMAND "
            "ends. The exit status is the command's (128+N if it died of signal N). While "
            "the command runs a watchdog renews the lease; if the lease is lost anyway "
            "(server unreachable for too long, --ttl ran out, force-released) the command "
            "gets SIGTERM, then SIGKILL after --grace seconds, and aiodlock exits 70. "
            "SIGINT, SIGTERM and SIGHUP sent to aiodlock are passed on to the command. "
            "The command sees AIODLOCK_NAME, AIODLOCK_TOKEN (the fencing token) and "
            "AIODLOCK_OWNER in its environment."
        ),
        epilog=(
            "exit statuses: the command's; 75 not acquired within --timeout (the command "
            "did not run); 70 lease lost (the command was stopped); 126/127 the command "
            "could not be executed / was not found; 2 usage or configuration error; 69 "
            "lock service unavailable; 128+N signal N arrived before the command started."
        ),
    )
    run.add_argument("name", metavar="NAME", help="the lock name")
    run.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="give up (exit 75) after S seconds; 0 tries once (default: wait forever)",
    )
    run.add_argument(
        "--ttl",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help=(
            "fixed lease of S seconds, never renewed: the command is stopped when it runs "
            "out (default: a watchdog renews the lease while aiodlock runs)"
        ),
    )
    run.add_argument(
        "--grace",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="after a lost lease, seconds between SIGTERM and SIGKILL (default: 5)",
    )
    run.add_argument(
        "command_args",
        nargs="*",
        metavar="COMMAND",
        help="the command and its arguments, after --",
    )

    status = commands.add_parser(
        "status",
        parents=[common],
        help="show who holds a lock (exit 0 held, 1 free)",
        description=(
            "Show the holder of the lock NAME (its owner string), its fencing token, the "
            "seconds left on its lease and, where the backend knows it, how many wait. "
            "Exits 0 when the lock is held and 1 when it is free."
        ),
    )
    status.add_argument("name", metavar="NAME", help="the lock name")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    release = commands.add_parser(
        "release",
        parents=[common],
        help="break a lock whoever holds it (needs --force)",
        description=(
            "Break the lock NAME whoever holds it (an admin operation). The holder is no "
            "longer protected: it notices the loss at its next renewal (an `aiodlock run` "
            "holder then stops its command). Exits 0 when a lock was broken, 1 when NAME "
            "was not held, 2 without --force."
        ),
    )
    release.add_argument("name", metavar="NAME", help="the lock name")
    release.add_argument("--force", action="store_true", help="really break the lock (required)")

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="N processes contend for one lock; checks mutual exclusion and tokens",
        description=(
            "Start N worker processes that contend for ONE lock: each loops acquire, a "
            "short critical section (1-3 ms), release. Every worker creates a marker file "
            "with O_CREAT|O_EXCL on entry and removes it on exit, and records monotonic "
            "enter/exit times with its fencing token. The report gives acquisitions, "
            "overlaps seen (must be 0), whether tokens strictly increase in the order of "
            "entry, wait times and hand-off gaps. Exits 1 if an overlap or a token out of "
            f"order was seen. Uses the namespace {DEMO_NAMESPACE!r} unless --namespace is "
            "given, so it never touches your own locks."
        ),
    )
    demo.add_argument(
        "--workers", type=_positive_int, default=4, metavar="N", help="processes (default: 4)"
    )
    stop = demo.add_mutually_exclusive_group()
    stop.add_argument(
        "--duration",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="contend for S seconds (default: 3)",
    )
    stop.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        metavar="N",
        help="each worker acquires N times instead of a fixed duration",
    )
    demo.add_argument(
        "--hold-ms",
        type=float,
        nargs=2,
        default=(1.0, 3.0),
        metavar=("MIN", "MAX"),
        help="critical section length range in milliseconds (default: 1 3)",
    )
    demo.add_argument("--name", default=DEMO_LOCK, help=f"lock name (default: {DEMO_LOCK})")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")

    # The worker half of ``demo``; not listed in the help.
    worker = commands.add_parser("_demo-worker", parents=[common])
    worker.add_argument("--index", type=int, required=True)
    worker.add_argument("--name", required=True)
    worker.add_argument("--marker-dir", required=True)
    worker.add_argument("--rounds", type=int, default=0)
    worker.add_argument("--hold-ms", type=float, nargs=2, default=(1.0, 3.0))
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    # ``run NAME [options] -- COMMAND ...``: everything after the first ``--`` that follows
    # ``run`` is the command, verbatim (argparse would otherwise read its options).
    tail: list[str] | None = None
    if "run" in argv and "--" in argv[argv.index("run") :]:
        cut = argv.index("--", argv.index("run"))
        argv, tail = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if tail is not None:
        if args.command != "run":  # "run" was an option's value: parse the whole thing
            args = parser.parse_args([*argv, "--", *tail])
        else:
            args.command_args = [*args.command_args, *tail]
    # Common options are accepted before and after the command; after wins.
    for option in ("url", "namespace", "verbose"):
        after = getattr(args, f"sub_{option}", None)
        if after is not None:
            setattr(args, option, after)
    return args


# -- helpers ---------------------------------------------------------------------------------


def _resolved_url(args: argparse.Namespace) -> str:
    url: str | None = args.url
    return url if url else default_url()


def _shown_url(url: str) -> str:
    """``url`` with any password masked (for messages)."""
    try:
        return parse_url(url).redacted()
    except ConfigurationError:
        return "<the URL>"


def _make_client(args: argparse.Namespace, **options: Any) -> Client:
    url = _resolved_url(args)
    if args.namespace is not None and "namespace" not in options:
        options["namespace"] = args.namespace
    return connect(url, **options)


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "no fixed end (bound to a server session)"
    return f"{value:.1f} s" if value >= 10 else f"{value:.3f} s"


def _status_dict(name: str, status: LockStatus | None) -> dict[str, Any]:
    if status is None:
        return {"name": name, "held": False}
    return {
        "name": name,
        "held": True,
        "owner": status.owner,
        "token": status.token,
        "expires_in": status.expires_in,
        "waiters": status.waiters,
    }


# -- run ----------------------------------------------------------------------------------


def _terminal_sends_to_child() -> bool:
    """Did a keyboard SIGINT also reach the child (same foreground process group)?"""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass
class _Signals:
    """Signals that reached ``aiodlock run``, and what to do with them."""

    cancel_wait: anyio.CancelScope
    child: asyncio.subprocess.Process | None = None
    received: int | None = None

    def handle(self, signum: int) -> None:
        if self.received is None:
            self.received = signum
        child = self.child
        if child is None:
            # Still connecting or waiting for the lock: give up, the command never runs.
            self.cancel_wait.cancel()
            return
        if child.returncode is not None:
            return
        if signum == signal.SIGINT and _terminal_sends_to_child():
            return  # the terminal sent it to the whole foreground group already
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)


@contextlib.contextmanager
def _signal_handlers(handler: Callable[[int], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    try:
        for sig in _FORWARDED_SIGNALS:
            try:
                loop.add_signal_handler(sig, handler, int(sig))
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover
                continue
            installed.append(int(sig))
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def _cmd_run(args: argparse.Namespace) -> int:
    command: list[str] = args.command_args
    if not command:
        raise _Exit(
            EX_CONFIG,
            "run: no command given; usage: aiodlock run NAME [options] -- COMMAND [ARGS...]",
        )
    signals = _Signals(anyio.CancelScope())
    client = _make_client(args)
    lock = client.lock(args.name, ttl=args.ttl, timeout=args.timeout, on_lost="ignore")
    with _signal_handlers(signals.handle):
        try:
            lease: Lease | None = None
            with signals.cancel_wait:  # a signal before the command starts cancels this
                await client.open()
                lease = await _acquire(client, lock, args)
            if lease is None or signals.received is not None:
                if lease is not None:
                    await lock.release()
                received = signals.received or int(signal.SIGINT)
                raise _Exit(
                    128 + received,
                    f"{signal.Signals(received).name} while waiting for lock "
                    f"{args.name!r}; the command did not run",
                )
            if args.verbose:
                _say(f"acquired lock {args.name!r} (token {lease.token}, owner {lease.owner})")
            try:
                return await _supervise(args, command, lease, signals)
            finally:
                lost_before_release = lease.lost
                try:
                    await lock.release()
                except (BackendError, LockLost) as exc:
                    _say(f"releasing lock {args.name!r} failed ({exc}); it ends with its lease")
                else:
                    if args.verbose and not lost_before_release:
                        _say(f"released lock {args.name!r}")
        finally:
            await client.close()


async def _acquire(client: Client, lock: Lock, args: argparse.Namespace) -> Lease:
    started = time.monotonic()
    try:
        if not args.verbose:
            return await lock.acquire()
        lease = await lock.try_acquire()
        if lease is not None:
            return lease
        if args.timeout == 0:
            raise LockTimeout(f"lock {args.name!r} is busy")
        holder = await client.status(args.name)
        _say(
            f"waiting for lock {args.name!r}"
            + (f" (held by {holder.owner}, token {holder.token})" if holder else "")
        )
        timeout = None if args.timeout is None else args.timeout - (time.monotonic() - started)
        return await lock.acquire(timeout=max(0.0, timeout) if timeout is not None else None)
    except LockTimeout:
        raise _Exit(EX_TEMPFAIL, await _busy_message(client, args)) from None


async def _busy_message(client: Client, args: argparse.Namespace) -> str:
    holder = ""
    with contextlib.suppress(LockError, OSError), anyio.move_on_after(client.config.op_timeout):
        status = await client.status(args.name)
        if status is not None:
            holder = f" (held by {status.owner}, token {status.token})"
    if args.timeout == 0:
        return f"lock {args.name!r} is busy{holder}; the command did not run"
    return f"lock {args.name!r} not acquired within {args.timeout:g} s{holder}; not run"


async def _supervise(
    args: argparse.Namespace, command: list[str], lease: Lease, signals: _Signals
) -> int:
    env = dict(os.environ)
    env["AIODLOCK_NAME"] = args.name
    env["AIODLOCK_TOKEN"] = str(lease.token)
    env["AIODLOCK_OWNER"] = lease.owner
    try:
        child = await asyncio.create_subprocess_exec(*command, env=env)
    except FileNotFoundError:
        raise _Exit(EX_COMMAND_NOT_FOUND, f"command not found: {command[0]}") from None
    except OSError as exc:
        raise _Exit(EX_NOT_EXECUTABLE, f"cannot run {command[0]}: {exc.strerror}") from None
    signals.child = child
    if signals.received is not None:  # arrived while the command was being started
        signals.handle(signals.received)
    waiting = asyncio.ensure_future(child.wait())
    lost = asyncio.ensure_future(lease.wait_lost())
    try:
        await asyncio.wait({waiting, lost}, return_when=asyncio.FIRST_COMPLETED)
        if child.returncode is None or lease.lost:
            # The lease is gone: the command runs unprotected.  Stop it.
            reason = lease.lost_reason or "the lease was lost"
            if child.returncode is None:
                _say(
                    f"lost lock {args.name!r} ({reason}); stopping the command "
                    f"(SIGTERM, SIGKILL after {args.grace:g} s)"
                )
                code = await _stop(child, args.grace)
                _say(f"the command was stopped; its status: {_exit_status(code)}")
            else:
                _say(
                    f"lost lock {args.name!r} ({reason}) before the command ended "
                    f"(its status: {_exit_status(child.returncode)})"
                )
            return EX_LOST
        return _exit_status(child.returncode)
    finally:
        for task in (waiting, lost):
            task.cancel()
        if child.returncode is None:  # an error or a cancellation of our own: never orphan
            with anyio.CancelScope(shield=True):
                await _stop(child, args.grace)


async def _stop(child: asyncio.subprocess.Process, grace: float) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the child's return code."""
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    with anyio.move_on_after(grace):
        return await child.wait()
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    return await child.wait()


# -- status and release ------------------------------------------------------------------


async def _cmd_status(args: argparse.Namespace) -> int:
    async with _make_client(args) as client:
        status = await client.status(args.name)
    if args.json:
        print(json.dumps(_status_dict(args.name, status)))
    elif status is None:
        print(f"lock {args.name!r} is free")
    else:
        print(f"lock {args.name!r} is held")
        print(f"  holder:     {status.owner}")
        print(f"  token:      {status.token}")
        print(f"  expires in: {_fmt_seconds(status.expires_in)}")
        if status.waiters is not None:
            print(f"  waiters:    {status.waiters}")
    return EX_OK if status is not None else EX_FREE


async def _cmd_release(args: argparse.Namespace) -> int:
    if not args.force:
        raise _Exit(
            EX_CONFIG,
            f"release: refusing to break lock {args.name!r} without --force. Breaking a lock "
            f"leaves its holder unprotected (it notices at its next renewal); a holder "
            f"releases its own lock when it is done. Add --force if you are sure.",
        )
    async with _make_client(args) as client:
        status = await client.status(args.name)
        released = await client.force_release(args.name)
    if not released:
        print(f"lock {args.name!r} was not held; nothing to release")
        return EX_FREE
    if status is not None:
        print(f"released lock {args.name!r} (held by {status.owner}, token {status.token})")
    else:
        print(f"released lock {args.name!r}")
    return EX_OK


# -- demo -------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Record:
    worker: int
    token: int
    requested: float
    entered: float
    exited: float


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.2f} ms"


def analyse(records: Sequence[_Record], collisions: int) -> dict[str, Any]:
    """Overlaps, token order and latencies of the critical sections of a demo run."""
    entries = sorted(records, key=lambda r: r.entered)
    overlaps = collisions
    latest_exit = -math.inf
    for record in entries:
        if record.entered < latest_exit:
            overlaps += 1
        latest_exit = max(latest_exit, record.exited)
    tokens = [r.token for r in entries]
    increasing = all(a < b for a, b in itertools.pairwise(tokens))
    waits = [r.entered - r.requested for r in entries]
    # Hand-off: the lock went from one holder to a worker that was already waiting.
    gaps = [
        b.entered - a.exited
        for a, b in itertools.pairwise(entries)
        if b.worker != a.worker and b.requested < a.exited
    ]
    return {
        "acquisitions": len(entries),
        "overlaps": overlaps,
        "marker_collisions": collisions,
        "tokens_increasing": increasing,
        "wait_p50": _percentile(waits, 50),
        "wait_p99": _percentile(waits, 99),
        "handoffs": len(gaps),
        "handoff_p50": _percentile(gaps, 50),
        "handoff_p99": _percentile(gaps, 99),
    }


async def _cmd_demo(args: argparse.Namespace) -> int:
    low, high = args.hold_ms
    if not 0 <= low <= high:
        raise _Exit(EX_CONFIG, "demo: --hold-ms needs 0 <= MIN <= MAX")
    url = _resolved_url(args)
    namespace = args.namespace or DEMO_NAMESPACE
    duration = args.duration if args.duration is not None else (None if args.rounds else 3.0)
    client = _make_client(args, namespace=namespace)
    if not client.backend.capabilities & Capability.CROSS_PROCESS:
        raise _Exit(
            EX_CONFIG,
            f"demo: {client.backend.describe()} locks live inside one process; the demo "
            f"needs a lock service shared by processes (the embedded SQLite default, or a "
            f"server URL)",
        )
    shown = client.backend.describe()
    async with client:  # creates the database / checks the server before starting workers
        previous = await client.status(args.name)
    if previous is not None and not args.json:
        _say(
            f"demo: lock {args.name!r} is held by {previous.owner}; the workers wait for it "
            f"(up to {_fmt_seconds(previous.expires_in)})"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aiodlock-demo-") as marker_dir:
        results = await _run_workers(args, url, namespace, marker_dir, duration)
    total = time.monotonic() - started

    records: list[_Record] = []
    collisions = 0
    errors: list[str] = []
    per_worker: dict[int, int] = {}
    for index, (result, stderr) in enumerate(results):
        if result is None:
            errors.append(f"worker {index} failed: {stderr.strip()[-2000:] or 'no output'}")
            continue
        collisions += int(result["collisions"])
        errors.extend(f"worker {index}: {e}" for e in result["errors"])
        per_worker[index] = len(result["records"])
        records.extend(_Record(index, *row) for row in result["records"])
    report = analyse(records, collisions)
    report.update(
        {
            "workers": args.workers,
            "per_worker": [per_worker.get(i, 0) for i in range(args.workers)],
            "errors": errors,
            "total_time": total,
            "url": shown,
            "namespace": namespace,
            "name": args.name,
        }
    )
    ok = (
        not errors
        and report["overlaps"] == 0
        and report["tokens_increasing"]
        and report["acquisitions"] > 0
    )
    report["ok"] = ok
    if args.json:
        print(json.dumps(report))
    else:
        _print_demo_report(report)
    return EX_OK if ok else EX_FREE


def _print_demo_report(report: dict[str, Any]) -> None:
    per = " ".join(f"w{i}={n}" for i, n in enumerate(report["per_worker"]))
    lines = [
        f"aiodlock demo: {report['workers']} "
        f"{'process' if report['workers'] == 1 else 'processes'}, one lock {report['name']!r} "
        f"(namespace {report['namespace']!r}) on {report['url']}",
        f"acquisitions: {report['acquisitions']} total; per worker: {per}",
        f"overlaps: {report['overlaps']}"
        + (
            f" (marker file collisions: {report['marker_collisions']})"
            if report["marker_collisions"]
            else ""
        ),
        f"tokens strictly increasing in entry order: "
        f"{'yes' if report['tokens_increasing'] else 'NO'}",
        f"wait time: p50 {_ms(report['wait_p50'])}, p99 {_ms(report['wait_p99'])}",
        f"handoff gap: p50 {_ms(report['handoff_p50'])}, p99 {_ms(report['handoff_p99'])} "
        f"({report['handoffs']} hand-offs to a waiting worker)",
        f"total time: {report['total_time']:.2f} s",
    ]
    lines.extend(f"error: {e}" for e in report["errors"])
    lines.append("result: OK" if report["ok"] else "result: FAILED")
    print("\n".join(lines), flush=True)


async def _run_workers(
    args: argparse.Namespace,
    url: str,
    namespace: str,
    marker_dir: str,
    duration: float | None,
) -> list[tuple[dict[str, Any] | None, str]]:
    env = dict(os.environ)
    env["AIODLOCK_URL"] = url  # not on the command line, where `ps` would show a password
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    argv = [
        sys.executable,
        "-m",
        "aiodlock",
        "_demo-worker",
        "--namespace",
        namespace,
        "--name",
        args.name,
        "--marker-dir",
        marker_dir,
        "--rounds",
        str(args.rounds or 0),
        "--hold-ms",
        str(args.hold_ms[0]),
        str(args.hold_ms[1]),
    ]
    procs: list[asyncio.subprocess.Process] = []
    readers: list[asyncio.Future[str]] = []
    stage = "start"
    try:
        for index in range(args.workers):
            procs.append(
                await asyncio.create_subprocess_exec(
                    *argv,
                    "--index",
                    str(index),
                    env=env,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        stderr_reads = [asyncio.ensure_future(_read_all(p.stderr)) for p in procs]
        readers.extend(stderr_reads)
        # Start together: every worker has connected before anyone contends.
        with anyio.fail_after(60):
            for proc, stderr_read in zip(procs, stderr_reads, strict=True):
                assert proc.stdout is not None
                line = await proc.stdout.readline()
                if line.strip() != b"ready":
                    await proc.wait()
                    stderr = (await stderr_read).strip()[-2000:]
                    raise _Exit(EX_UNAVAILABLE, f"demo: a worker failed to start: {stderr}")
        stage = "finish"
        deadline = 0.0 if duration is None else time.monotonic() + duration
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {deadline!r}\n".encode())
            await proc.stdin.drain()
            proc.stdin.close()
        outputs = [asyncio.ensure_future(_read_all(p.stdout)) for p in procs]
        readers.extend(outputs)
        with anyio.fail_after(60.0 + (duration or 0.0)):
            texts = await asyncio.gather(*outputs)
            stderrs = await asyncio.gather(*stderr_reads)
            for proc in procs:
                await proc.wait()
        results: list[tuple[dict[str, Any] | None, str]] = []
        for proc, text, stderr in zip(procs, texts, stderrs, strict=True):
            parsed: dict[str, Any] | None = None
            if proc.returncode == 0:
                with contextlib.suppress(ValueError):
                    parsed = json.loads(text)
            results.append((parsed, stderr))
        return results
    except TimeoutError:
        raise _Exit(
            EX_FREE, f"demo: the workers did not {stage} in time; they were killed"
        ) from None
    finally:
        for reader in readers:
            reader.cancel()
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with anyio.CancelScope(shield=True):
                    await proc.wait()


async def _read_all(stream: asyncio.StreamReader | None) -> str:
    if stream is None:
        return ""
    data = await stream.read()
    return data.decode(errors="replace")


async def _cmd_demo_worker(args: argparse.Namespace) -> int:
    """One demo worker: prints ``ready``, waits for ``go DEADLINE``, loops, prints JSON."""
    low, high = (x / 1000 for x in args.hold_ms)
    marker = os.path.join(args.marker_dir, "inside")
    rng = random.Random()
    records: list[tuple[int, float, float, float]] = []
    collisions = 0
    errors: list[str] = []
    # A fixed lease: a crashed worker frees the lock within seconds, not watchdog_ttl.
    async with _make_client(args) as client:
        lock = client.lock(args.name, ttl=10.0)
        print("ready", flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        parts = line.split()
        if len(parts) != 2 or parts[0] != "go":
            return EX_CONFIG
        deadline = float(parts[1])
        while True:
            if args.rounds and len(records) >= args.rounds:
                break
            if deadline and time.monotonic() >= deadline:
                break
            requested = time.monotonic()
            try:
                lease = await lock.acquire()
            except LockError as exc:
                errors.append(f"acquire: {exc}")
                break
            entered = time.monotonic()
            mine = True
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                collisions += 1  # somebody else is inside
                mine = False
            else:
                os.close(fd)
            await asyncio.sleep(rng.uniform(low, high))
            if mine:
                try:
                    os.remove(marker)
                except FileNotFoundError:
                    collisions += 1  # somebody else came in and left meanwhile
            exited = time.monotonic()
            try:
                await lock.release()
            except LockError as exc:
                errors.append(f"release: {exc}")
            records.append((lease.token, requested, entered, exited))
    print(json.dumps({"records": records, "collisions": collisions, "errors": errors}))
    return EX_OK


# -- entry point -----------------------------------------------------------------------------

_COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "run": _cmd_run,
    "status": _cmd_status,
    "release": _cmd_release,
    "demo": _cmd_demo,
    "_demo-worker": _cmd_demo_worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aiodlock`` command; returns the exit status."""
    parser = build_parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    if not args.verbose:
        # The commands say it themselves when a lease is lost ("lost lock ..."): the
        # library's own warning would print the same news twice.
        handler.addFilter(lambda record: getattr(record, "aiodlock_event", None) != "lost")
    library_log = logging.getLogger("aiodlock")
    library_log.addHandler(handler)
    library_log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return asyncio.run(_COMMANDS[args.command](args))
    except _Exit as exc:
        if exc.message:
            _say(exc.message)
        return exc.status
    except (ConfigurationError, Unsupported) as exc:
        _say(str(exc))
        return EX_CONFIG
    except BackendError as exc:
        _say(f"the lock service at {_shown_url(_resolved_url(args))} failed: {exc}")
        return EX_UNAVAILABLE
    except LockError as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EX_LOST
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        library_log.removeHandler(handler)
