"""``aiodlock status`` and ``aiodlock release --force``: look at a lock, break a lock."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import LockStatus
from ._common import EX_CONFIG, EX_FREE, EX_OK, _Exit, _fmt_seconds, _make_client


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
