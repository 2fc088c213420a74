"""The argument parser of the ``aiodlock`` command."""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

from .. import __version__
from ._common import DEMO_LOCK, DEMO_NAMESPACE, EX_CONFIG


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
zookeeper://zk1:2181,zk2:2181/app, sqlite:////var/lock/app.db.
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
    parser = _Parser(
        prog="aiodlock",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aiodlock {__version__}")
    # The lock service's options, before the command and after it (the parent ``common``,
    # which sets only what is given there: after wins).
    common = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
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
            "Acquire the lock NAME, run COMMAND while holding it (a watchdog renews the "
            "lease), release it when COMMAND ends. If the lease is lost (server unreachable "
            "for too long, --ttl ran out, force-released) the command gets SIGTERM, then "
            "SIGKILL after --grace seconds; aiodlock exits 70 whenever the lease was lost "
            "before the command ended. SIGINT, SIGTERM and SIGHUP are passed on to the "
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
        type=_seconds,
        metavar="S",
        help="give up (exit 75) after S seconds; 0 tries once (default: wait forever)",
    )
    run.add_argument(
        "--ttl",
        type=_positive_seconds,
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
        "--workers", type=_positive_int, default=4, metavar="N", help="processes (default: 4)"
    )
    stop = demo.add_mutually_exclusive_group()
    stop.add_argument(
        "--duration", type=_positive_seconds, metavar="S", help="contend for S seconds (default: 3)"
    )
    stop.add_argument(
        "--rounds",
        type=_positive_int,
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

    commands.add_parser("_demo-worker", parents=[common])  # demo's worker (not in the help)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
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
    return args
