"""A separate OS process contending for SQLite locks (run by the tests, not collected).

Usage:
  python sqlite_worker.py contend URL NAME ROUNDS MARKER LOG
      take NAME ROUNDS times; inside each critical section create MARKER exclusively (an
      overlap if it already exists) and append "token pid ok|OVERLAP" to LOG.
  python sqlite_worker.py serve URL NAME [OPTION=VALUE...]
      read commands from stdin: "acquire" -> prints "HELD <token>"; "release" -> prints
      "RELEASED <time.time() just before releasing>"; "quit" -> exits.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import aiodlock


async def contend(url: str, name: str, rounds: int, marker: str, log: str) -> None:
    async with aiodlock.connect(url, poll_min=0.001, poll_max=0.005) as client:
        for _ in range(rounds):
            async with client.lock(name, timeout=60) as lease:
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    fd = None
                state = "ok" if fd is not None else "OVERLAP"
                entry = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.write(entry, f"{lease.token} {os.getpid()} {state}\n".encode())
                os.close(entry)
                await asyncio.sleep(0.002)
                if fd is not None:
                    os.close(fd)
                    os.unlink(marker)
            # Give the other processes a chance (else one process re-takes it at once).
            await asyncio.sleep(random.uniform(0.001, 0.006))


async def serve(url: str, name: str, options: dict[str, str]) -> None:
    loop = asyncio.get_running_loop()
    async with aiodlock.connect(url, **options) as client:
        lock = client.lock(name)
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "acquire":
                lease = await lock.acquire()
                print(f"HELD {lease.token}", flush=True)
            elif line == "release":
                now = time.time()
                await lock.release()
                print(f"RELEASED {now}", flush=True)
            else:
                return


def main() -> None:
    mode, url, name, *rest = sys.argv[1:]
    if mode == "contend":
        asyncio.run(contend(url, name, int(rest[0]), rest[1], rest[2]))
    elif mode == "serve":
        options = dict(item.split("=", 1) for item in rest)
        asyncio.run(serve(url, name, options))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
