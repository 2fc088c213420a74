"""The argument parser of the ``aiodlock`` command (usage errors exit 2, as argparse's do)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from .. import __version__
from ._common import DEMO_LOCK, DEMO_NAMESPACE


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

The lock service is --url (accepted before or after the command), else the
environment variable AIODLOCK_URL, else the embedded default: a SQLite file in
the user cache dir ($XDG_CACHE_HOME/aiodlock/locks.db), shared by every process
of this host. Examples of URLs: redis://127.0.0.1:6379/0,
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
    """The argument parser of the ``aiodlock`` command."""
    parser = argparse.ArgumentParser(
        prog="aiodlock",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aiodlock {__version__}")
    # The lock service's options, before the command and after it (the parent ``common``,
    # which sets only what is given there: after wins).
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for options in (parser, common.add_argument_group("lock service")):
        options.add_argument(
            "--url",
            metavar="URL",
            help="lock service URL (default: $AIODLOCK_URL, else the embedded SQLite file)",
        )
        options.add_argument(
            "--namespace",
            metavar="NS",
            help="key prefix that separates applications on one server (default: aiodlock)",
        )
        options.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            help="say what happens (acquired, released, tokens) on stderr",
        )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.required = True

    run = commands.add_parser(
        "run",
        parents=[common],
        usage="aiodlock run [options] NAME -- COMMAND [ARGS...]",
        help="run a command while holding a lock (like flock(1), across hosts)",
        description=(
            "Acquire the lock NAME, run COMMAND while holding it (a watchdog renews the "
            "lease), release it when COMMAND ends. If the lease is lost (server unreachable "
            "for too long, --ttl ran out, force-released) the command gets SIGTERM, then "
            "SIGKILL after --grace seconds. SIGINT, SIGTERM and SIGHUP are passed on to the "
            "command, which sees AIODLOCK_NAME, AIODLOCK_TOKEN (the fencing token) and "
            "AIODLOCK_OWNER in its environment."
        ),
        epilog=(
            "exit statuses: the command's; 75 not acquired within --timeout (the command "
            "did not run); 70 lease lost before the command ended; 126/127 the command "
            "could not be executed / was not found; 2 usage or configuration error; 69 "
            "lock service unavailable; 128+N signal N arrived before the command started."
        ),
    )
    run.add_argument("name", metavar="NAME", help="the lock name")
    run.add_argument(
        "--timeout",
        type=_TIMEOUT,
        metavar="S",
        help="give up (exit 75) after S seconds; 0 tries once (default: wait without limit)",
    )
    run.add_argument(
        "--ttl",
        type=_POSITIVE_SECONDS,
        metavar="S",
        help="a lease of S seconds, never renewed (default: a watchdog renews it)",
    )
    run.add_argument(
        "--grace",
        type=_SECONDS,
        default=5.0,
        metavar="S",
        help="after a lost lease, seconds between SIGTERM and SIGKILL (default: 5)",
    )
    run.add_argument("command_args", nargs="*", metavar="COMMAND", help="the command, after --")

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
            "longer protected: it notices the loss at its next renewal or release (an "
            "`aiodlock run` holder then stops its command, or exits 70). Exits 0 when a "
            "lock was broken, 1 when NAME was not held, 2 without --force."
        ),
    )
    release.add_argument("name", metavar="NAME", help="the lock name")
    release.add_argument("--force", action="store_true", help="really break the lock (required)")

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="N processes contend for one lock; checks mutual exclusion and tokens",
        description=(
            "Start N worker processes that contend for ONE lock, each looping acquire, a "
            "short critical section (--hold-ms) with a marker file created O_CREAT|O_EXCL, "
            "release. The report gives acquisitions, overlaps seen (must be 0), whether "
            "tokens strictly increase in entry order, wait times and hand-off gaps; exit 1 "
            f"if an overlap or a token out of order was seen. Uses the namespace "
            f"{DEMO_NAMESPACE} unless --namespace is given: it never touches your locks."
        ),
    )
    demo.add_argument(
        "--workers", type=_POSITIVE_INT, default=4, metavar="N", help="processes (default: 4)"
    )
    stop = demo.add_mutually_exclusive_group()
    stop.add_argument(
        "--duration", type=_POSITIVE_SECONDS, metavar="S", help="contend for S seconds (default: 3)"
    )
    stop.add_argument(
        "--rounds", type=_POSITIVE_INT, metavar="N", help="each worker acquires N times instead"
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

    commands.add_parser("_demo-worker", parents=[common])  # demo's worker (not in the help)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    # ``run ... -- COMMAND ...``: everything after the first ``--`` that follows ``run`` is the
    # command, verbatim (argparse would otherwise read its options).
    if "run" in argv and "--" in argv[argv.index("run") :]:
        cut = argv.index("--", argv.index("run"))
        args = parser.parse_args(argv[:cut])
        if args.command == "run":  # (else "run" was an option's value: parse the whole thing)
            args.command_args += argv[cut + 1 :]
            return args
    return parser.parse_args(argv)
