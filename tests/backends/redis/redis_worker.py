"""A separate OS process holding a Redis lock (run by the tests, not collected).

Usage: python redis_worker.py URL NAME [OPTION=VALUE...]
    acquire NAME (watchdog-renewed), print "HELD <token> <owner>", then sleep until killed.
"""

from __future__ import annotations

import asyncio
import sys

import aiodlock


async def hold(url: str, name: str, options: dict[str, str]) -> None:
    async with aiodlock.connect(url, **options) as client:
        lease = await client.lock(name).acquire(timeout=30)
        print(f"HELD {lease.token} {lease.owner}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    url, name, *rest = sys.argv[1:]
    options = dict(item.split("=", 1) for item in rest)
    asyncio.run(hold(url, name, options))


if __name__ == "__main__":
    main()
