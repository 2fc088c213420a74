"""The ``aiodlock`` command line (also ``python -m aiodlock``); docs/cli.md describes it."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import signal
import sys
from collections.abc import Callable, Sequence

from .. import BackendError, ConfigurationError, LockError, Unsupported, __version__
from ._common import (
    DEMO_LOCK,
    DEMO_WORKER,
    Exit,
    ExitStatus,
    fmt_seconds,
    held_by,
    make_client,
    say,
    shown_url,
)
from ._common import DEMO_NAMESPACE as DEMO_NAMESPACE
from ._demo import cmd_demo, cmd_demo_worker
from ._run import cmd_run


def _checked(
    need: str, ok: Callable[[float], bool], kind: Callable[[str], float] = float
) -> Callable[[str], float]:
    """An argparse type: ``kind(text)``, refused unless ``ok`` with a message that says ``need``."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number of seconds"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not ok(value):  # (NaN passes no comparison)
            raise argparse.ArgumentTypeError(f"must be {need}, got {text!r}")
        return value

    return convert


_SECONDS = _checked("0 or more seconds", lambda value: value >= 0)
_TIMEOUT = _checked(
    "a finite number of seconds >= 0 (leave out --timeout to wait without limit)",
    lambda value: 0 <= value < math.inf,
)
_POSITIVE_SECONDS = _checked("a finite number of seconds > 0", lambda value: 0 < value < math.inf)
_POSITIVE_INT = _checked("1 or more", lambda value: value >= 1, int)

_DESCRIPTION = """\
Distributed locks from the shell.

The lock service is --url (before or after the command), else $AIODLOCK_URL,
else the embedded default: a SQLite file shared by the processes of this host
($XDG_CACHE_HOME/aiodlock/locks.db). Examples of URLs: redis://127.0.0.1:6379/0,
zookeeper://zk1:2181,zk2:2181/app, sqlite:////var/lock/app.db.
"""

_EPILOG = """\
examples:
  aiodlock run nightly-backup -- /usr/local/bin/backup.sh --full
  aiodlock run --timeout 0 cron:report -- python report.py   # skip if running
  aiodlock --url redis://10.0.0.5:6379/0 status nightly-backup
  aiodlock release nightly-backup --force
  aiodlock demo --workers 8

exit statuses: 2 usage or configuration error, 69 lock service unavailable;
the others in `aiodlock COMMAND --help` and docs/cli.md.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiodlock",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aiodlock {__version__}")
    # The lock service's options, before the command and after it (the parents ``common`` and
    # ``demo_common``, which set only what is given there: after wins).
    _add_service_options(parser.add_argument, "aiodlock")
    common, demo_common = _service_options("aiodlock"), _service_options(DEMO_NAMESPACE)
    named = argparse.ArgumentParser(add_help=False)  # (the commands that take a lock name)
    named.add_argument("name", metavar="NAME", help="the lock name")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.required = True

    run = commands.add_parser(
        "run",
        parents=[common, named],
        usage="aiodlock run [options] NAME -- COMMAND [ARGS...]",
        help="run a command while holding a lock (like flock(1), across hosts)",
        description=(
            "Acquire the lock NAME (waiting without limit unless --timeout S; 0 tries once), "
            "run COMMAND while holding it (a watchdog renews the lease unless --ttl S gives "
            "a fixed one), release it when COMMAND ends. If the lease is lost (server "
            "unreachable for too long, --ttl ran out, force-released) the command gets "
            "SIGTERM, then SIGKILL --grace S seconds later. SIGINT, SIGTERM and SIGHUP are "
            "passed on to the command, which sees AIODLOCK_NAME, AIODLOCK_TOKEN (the fencing "
            "token) and AIODLOCK_OWNER in its environment."
        ),
        epilog=(
            "exit statuses: the command's; 75 not acquired within --timeout (the command "
            "did not run); 70 lease lost before the command ended; 126/127 the command "
            "could not be executed / was not found; 2 usage or configuration error; 69 "
            "lock service unavailable; 128+N signal N arrived before the command started."
        ),
    )
    run.set_defaults(handler=cmd_run)
    run.add_argument(
        "--timeout", type=_TIMEOUT, metavar="S", help="give up (exit 75) after S seconds"
    )
    run.add_argument(
        "--ttl", type=_POSITIVE_SECONDS, metavar="S", help="a fixed lease of S s, never renewed"
    )
    run.add_argument(
        "--grace", type=_SECONDS, default=5.0, metavar="S", help="wait before SIGKILL (default: 5)"
    )
    run.add_argument("command_args", nargs="*", metavar="COMMAND", help="the command, after --")

    status = commands.add_parser(
        "status",
        parents=[common, named],
        help="show who holds a lock (exit 0 held, 1 free)",
        description=(
            "Show the holder of the lock NAME (its owner string), its fencing token, the "
            "seconds left on its lease and, where the backend knows it, how many wait. "
            "Exits 0 when the lock is held and 1 when it is free."
        ),
    )
    status.set_defaults(handler=cmd_status)
    status.add_argument("--json", action="store_true", help="print one JSON object")

    release = commands.add_parser(
        "release",
        parents=[common, named],
        help="break a lock whoever holds it (needs --force)",
        description=(
            "Break the lock NAME whoever holds it (an admin operation). The holder is no "
            "longer protected: it notices the loss at its next renewal or release (an "
            "`aiodlock run` holder then stops its command, or exits 70). Exits 0 when a "
            "lock was broken, 1 when NAME was not held, 2 without --force."
        ),
    )
    release.set_defaults(handler=cmd_release)
    release.add_argument("--force", action="store_true", help="really break the lock (required)")

    demo = commands.add_parser(
        "demo",
        parents=[demo_common],
        help="N processes contend for one lock; checks mutual exclusion and tokens",
        description=(
            "Start --workers N processes that contend for ONE lock for --duration S seconds "
            "or --rounds N acquisitions each: acquire, a critical section (--hold-ms) with a "
            "marker file created O_CREAT|O_EXCL, release. The report gives overlaps (must be "
            "0), token order, wait times and hand-off gaps; exit 1 on an overlap, a token out "
            f"of order or a worker error. The namespace is {DEMO_NAMESPACE} unless --namespace "
            "is given: your locks are never touched."
        ),
    )
    demo.set_defaults(handler=cmd_demo)
    demo.add_argument("--workers", type=_POSITIVE_INT, default=4, metavar="N", help="(default: 4)")
    stop = demo.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=_POSITIVE_SECONDS, metavar="S", help="(default: 3)")
    stop.add_argument("--rounds", type=_POSITIVE_INT, metavar="N", help="instead of --duration")
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

    demo.add_argument(
        "--fair",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="grant in request order (default: where the lock service offers fair=True)",
    )
    return parser


def _add_service_options(add_argument: Callable[..., object], namespace: str) -> None:
    """The lock service's options (``add_argument`` of a parser or of a group)."""
    add_argument("--url", metavar="URL", help="lock service (default: $AIODLOCK_URL, else SQLite)")
    add_argument(
        "--namespace", metavar="NS", help=f"key prefix of the locks (default: {namespace})"
    )
    add_argument(
        "-v", "--verbose", action="store_true", help="say what happens on stderr (tokens too)"
    )


def _service_options(namespace: str) -> argparse.ArgumentParser:
    """A parent parser with the lock service's options (default ``namespace`` in the help)."""
    parent = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    _add_service_options(parent.add_argument_group("lock service").add_argument, namespace)
    return parent


def _worker_parser() -> argparse.ArgumentParser:
    """``aiodlock _demo-worker``: the demo's own worker processes, not a user command (so it
    is not among the commands that ``--help`` and a usage error list)."""
    parser = argparse.ArgumentParser(prog="aiodlock _demo-worker")
    _add_service_options(parser.add_argument, DEMO_NAMESPACE)
    parser.set_defaults(handler=cmd_demo_worker)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    if argv[:1] == [DEMO_WORKER]:
        return _worker_parser().parse_args(argv[1:])
    # ``run ... -- COMMAND``: what follows the first ``--`` after ``run`` is read verbatim.
    if "run" in argv and "--" in argv[argv.index("run") :]:
        cut = argv.index("--", argv.index("run"))
        args = parser.parse_args(argv[:cut])
        if args.command == "run":  # (else "run" was an option's value: parse the whole thing)
            args.command_args += argv[cut + 1 :]
            return args
    return parser.parse_args(argv)


async def cmd_status(args: argparse.Namespace) -> int:
    async with make_client(args) as client:
        status = await client.status(args.name)
    if args.json:
        fields = ("owner", "token", "expires_in", "waiters") if status else ()
        held = {field: getattr(status, field) for field in fields}
        print(json.dumps({"name": args.name, "held": status is not None, **held}))
    elif status is None:
        print(f"lock {args.name!r} is free")
    else:
        print(f"lock {args.name!r} is held")
        print(f"  holder:     {status.owner}")
        print(f"  token:      {status.token}")
        print(f"  expires in: {fmt_seconds(status.expires_in)}")
        if status.waiters is not None:
            print(f"  waiters:    {status.waiters}")
    return ExitStatus.OK if status is not None else ExitStatus.FREE


async def cmd_release(args: argparse.Namespace) -> int:
    if not args.force:
        raise Exit(
            ExitStatus.CONFIG,
            f"release: refusing to break lock {args.name!r} without --force. Breaking a lock "
            f"leaves its holder unprotected (it notices at its next renewal); a holder "
            f"releases its own lock when it is done. Add --force if you are sure.",
        )
    async with make_client(args) as client:
        status = await client.status(args.name)
        released = await client.force_release(args.name)
    if not released:
        print(f"lock {args.name!r} was not held; nothing to release")
        return ExitStatus.FREE
    print(f"released lock {args.name!r}{held_by(status)}")
    return ExitStatus.OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aiodlock`` command; returns the exit status."""
    args = parse_args(build_parser(), list(sys.argv[1:] if argv is None else argv))
    handler = logging.StreamHandler()  # (on stderr, the message alone)
    if not args.verbose:  # the commands say "lost lock ..." themselves: no repetition
        handler.addFilter(lambda record: getattr(record, "aiodlock_event", None) != "lost")
    library_log = logging.getLogger("aiodlock")
    library_log.addHandler(handler)
    library_log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(asyncio.run(args.handler(args)))
    except Exit as exc:
        say(exc.message)
        return exc.status
    except (ConfigurationError, Unsupported) as exc:
        say(str(exc))
        return ExitStatus.CONFIG
    except BackendError as exc:
        say(f"the lock service at {shown_url(args)} failed: {exc}")
        return ExitStatus.UNAVAILABLE
    except LockError as exc:
        say(f"{type(exc).__name__}: {exc}")
        return ExitStatus.LOST
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        library_log.removeHandler(handler)
