"""A separate OS process that uses a ZooKeeper lock (started by the tests).

zk_worker.py hold URL NAME            acquire, print "held TOKEN", then sleep for ever
zk_worker.py cycles URL NAME N FILE   N lock cycles; inside each, append "enter PID" and
                                      "exit PID" lines to FILE (overlaps show as two
                                      enters in a row); print "done"
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiodlock


async def hold(url: str, name: str) -> None:
    async with aiodlock.connect(url) as client:
        lease = await client.lock(name).acquire()
        print(f"held {lease.token}", flush=True)
        await asyncio.Event().wait()


def append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line + "\n")


async def cycles(url: str, name: str, count: int, path: str) -> None:
    pid = os.getpid()
    async with aiodlock.connect(url) as client:
        lock = client.lock(name)
        for _ in range(count):
            async with lock as lease:
                append(path, f"enter {pid} {lease.token}")
                await asyncio.sleep(0.002)
                append(path, f"exit {pid} {lease.token}")
    print("done", flush=True)


def main() -> None:
    mode, url, name, *rest = sys.argv[1:]
    if mode == "hold":
        asyncio.run(hold(url, name))
    elif mode == "cycles":
        asyncio.run(cycles(url, name, int(rest[0]), rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
