"""The ``aiodlock`` command line (also ``python -m aiodlock``); docs/cli.md describes it."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .. import BackendError, ConfigurationError, LockError, Unsupported
from ._common import DEMO_NAMESPACE as DEMO_NAMESPACE
from ._common import Exit, ExitStatus, fmt_seconds, held_by, make_client, say, shown_url
from ._demo import Record as Record
from ._demo import analyse as analyse
from ._demo import cmd_demo, cmd_demo_worker
from ._parser import build_parser, parse_args
from ._run import cmd_run


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


_COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "run": cmd_run,
    "status": cmd_status,
    "release": cmd_release,
    "demo": cmd_demo,
    "_demo-worker": cmd_demo_worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aiodlock`` command; returns the exit status."""
    args = parse_args(build_parser(), list(sys.argv[1:] if argv is None else argv))
    handler = logging.StreamHandler()  # (on stderr, the message alone)
    if not args.verbose:
        # The commands say it themselves when a lease is lost ("lost lock ..."): the
        # library's own warning would print the same news twice.
        handler.addFilter(lambda record: getattr(record, "aiodlock_event", None) != "lost")
    library_log = logging.getLogger("aiodlock")
    library_log.addHandler(handler)
    library_log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return asyncio.run(_COMMANDS[args.command](args))
    except Exit as exc:
        if exc.message:
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
