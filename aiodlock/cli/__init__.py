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
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .. import BackendError, ConfigurationError, LockError, Unsupported
from ._admin import _cmd_release, _cmd_status

# ``NAME as NAME``: re-exported from the package, where they were before it was split into
# modules (the demo's lock names, analysis and record; the parser's post-processing).
from ._common import DEMO_LOCK as DEMO_LOCK
from ._common import DEMO_NAMESPACE as DEMO_NAMESPACE
from ._common import (
    EX_COMMAND_NOT_FOUND,
    EX_CONFIG,
    EX_FREE,
    EX_LOST,
    EX_NOT_EXECUTABLE,
    EX_OK,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    _Exit,
    _resolved_url,
    _say,
    _shown_url,
)
from ._demo import _cmd_demo, _cmd_demo_worker
from ._demo import _Record as _Record
from ._demo import analyse as analyse
from ._parser import _parse as _parse
from ._parser import build_parser
from ._run import _cmd_run

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
