"""The ``aiodlock`` command line (also ``python -m aiodlock``): ``run``, ``status``,
``release --force`` and ``demo``; docs/cli.md describes the commands and exit statuses.

The lock service is ``--url`` (before or after the command), else ``AIODLOCK_URL``, else
the embedded default (:func:`aiodlock.default_url`: a SQLite file in the user cache dir).
"""

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
from ._common import DEMO_LOCK as DEMO_LOCK
from ._common import DEMO_NAMESPACE as DEMO_NAMESPACE
from ._common import EX_COMMAND_NOT_FOUND as EX_COMMAND_NOT_FOUND
from ._common import EX_CONFIG as EX_CONFIG
from ._common import EX_FREE as EX_FREE
from ._common import EX_LOST as EX_LOST
from ._common import EX_NOT_EXECUTABLE as EX_NOT_EXECUTABLE
from ._common import EX_OK as EX_OK
from ._common import EX_TEMPFAIL as EX_TEMPFAIL
from ._common import EX_UNAVAILABLE as EX_UNAVAILABLE
from ._common import Exit, fmt_seconds, make_client, resolved_url, say, shown_url
from ._demo import Record, cmd_demo, cmd_demo_worker
from ._demo import analyse as analyse
from ._parser import build_parser as build_parser
from ._parser import parse_args
from ._run import cmd_run

# (re-exported ``X as X``; ``_Record`` and ``_parse``: the names these had before the split)
_Record, _parse = Record, parse_args


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
    return EX_OK if status is not None else EX_FREE


async def cmd_release(args: argparse.Namespace) -> int:
    if not args.force:
        raise Exit(
            EX_CONFIG,
            f"release: refusing to break lock {args.name!r} without --force. Breaking a lock "
            f"leaves its holder unprotected (it notices at its next renewal); a holder "
            f"releases its own lock when it is done. Add --force if you are sure.",
        )
    async with make_client(args) as client:
        status = await client.status(args.name)
        released = await client.force_release(args.name)
    if not released:
        print(f"lock {args.name!r} was not held; nothing to release")
        return EX_FREE
    held = "" if status is None else f" (held by {status.owner}, token {status.token})"
    print(f"released lock {args.name!r}{held}")
    return EX_OK


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
    except Exit as exc:
        if exc.message:
            say(exc.message)
        return exc.status
    except (ConfigurationError, Unsupported) as exc:
        say(str(exc))
        return EX_CONFIG
    except BackendError as exc:
        say(f"the lock service at {shown_url(resolved_url(args))} failed: {exc}")
        return EX_UNAVAILABLE
    except LockError as exc:
        say(f"{type(exc).__name__}: {exc}")
        return EX_LOST
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        library_log.removeHandler(handler)
