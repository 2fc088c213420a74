"""A separate OS process taking turns on a Redlock lock (run by the tests, not collected).

Usage: python redlock_worker.py URL NAME ROUNDS MARKER [OPTION=VALUE...]

Each round: acquire NAME, create MARKER exclusively (it exists only while somebody is
inside, so a second holder finds it), note the token and the times, remove MARKER, release.
Prints one line per round, ``ROUND <token> <entered> <left>`` (``time.monotonic()``, the
same clock in every process of the host), or ``OVERLAP ...`` when MARKER already existed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import aiodlock


async def run(url: str, name: str, rounds: int, marker: str, options: dict[str, str]) -> None:
    async with aiodlock.connect(url, **options) as client:
        lock = client.lock(name)
        for _ in range(rounds):
            async with lock as lease:
                entered = time.monotonic()
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    print(f"OVERLAP {lease.token}", flush=True)
                    continue
                os.close(fd)
                await asyncio.sleep(0.002)
                left = time.monotonic()
                os.unlink(marker)
            print(f"ROUND {lease.token} {entered:.6f} {left:.6f}", flush=True)


def main() -> None:
    url, name, rounds, marker, *rest = sys.argv[1:]
    options = dict(item.split("=", 1) for item in rest)
    asyncio.run(run(url, name, int(rounds), marker, options))


if __name__ == "__main__":
    main()
