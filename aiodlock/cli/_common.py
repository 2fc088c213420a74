"""What the commands of :mod:`aiodlock.cli` share: exit statuses, errors, the client."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import sys

from .. import Client, LockStatus, connect, default_url
from .._url import parse_url

DEMO_NAMESPACE = DEMO_LOCK = "aiodlock-demo"
DEMO_WORKER = "_demo-worker"  # (the command line of the demo's worker processes)


class ExitStatus(enum.IntEnum):
    """The statuses ``aiodlock`` chooses itself (BSD sysexits where one fits)."""

    OK = 0
    FREE = 1  # status: the lock is free; release: nothing to release; demo: a failure seen
    CONFIG = 2  # usage or configuration error (bad option or URL, unknown scheme, no extra)
    UNAVAILABLE = 69  # the lock service failed or could not be reached
    LOST = 70  # run: the lease was lost before the command ended (EX_SOFTWARE)
    TEMPFAIL = 75  # run: the lock was not acquired within --timeout; the command did not run
    NOT_EXECUTABLE = 126  # run: the command could not be executed (as in a POSIX shell)
    COMMAND_NOT_FOUND = 127  # run: the command was not found (as in a POSIX shell)


@dataclasses.dataclass(eq=False)
class Exit(Exception):
    """Leave with ``status`` after printing ``message`` on stderr."""

    status: int
    message: str


def say(message: str) -> None:
    print(f"aiodlock: {message}", file=sys.stderr, flush=True)


def resolved_url(args: argparse.Namespace) -> str:
    return str(args.url or default_url())


def shown_url(args: argparse.Namespace) -> str:
    """The URL redacted (connect() has parsed it already: this parse cannot fail)."""
    return str(parse_url(resolved_url(args)))


def make_client(args: argparse.Namespace) -> Client:
    options = {} if args.namespace is None else {"namespace": args.namespace}
    return connect(resolved_url(args), **options)


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "no fixed end (bound to a server session)"
    return f"{value:.1f} s" if value >= 10 else f"{value:.3f} s"


def held_by(status: LockStatus | None) -> str:
    return "" if status is None else f" (held by {status.owner}, token {status.token})"
