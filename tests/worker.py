"""The one cross-process worker of the tests: another OS process using aiodlock, any backend.

Run as a script (by ``tests.helpers.worker_command``), never collected:

  worker.py hold URL NAME [OPTION=VALUE...]
      acquire NAME, print "HELD <token> <owner>", then sleep until killed.
  worker.py cycles URL NAME ROUNDS LOG [OPTION=VALUE...]
      ROUNDS lock cycles on NAME.  Inside each, create LOG.inside exclusively (it exists
      only while somebody holds the lock, so a second holder finds it), hold 2 ms, and
      append "<token> <pid> <entered> <left> ok|OVERLAP" to LOG (``time.monotonic()``:
      one clock for every process of a host).  A random pause of 0-4 ms between cycles
      lets the other processes in.  Prints "done" at the end.
  worker.py serve URL NAME [OPTION=VALUE...]
      commands on stdin: "acquire" prints "HELD <token>"; "release" prints
      "RELEASED <time.time() just before releasing>"; anything else ends the process.

OPTION=VALUE pairs are passed to ``aiodlock.connect``.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import aiodlock


async def hold(client: aiodlock.Client, name: str) -> None:
    lease = await client.lock(name).acquire(timeout=60)
    print(f"HELD {lease.token} {lease.owner}", flush=True)
    await asyncio.Event().wait()


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def cycles(client: aiodlock.Client, name: str, rounds: int, log: str) -> None:
    marker = log + ".inside"
    pid = os.getpid()
    lock = client.lock(name, timeout=60)
    for _ in range(rounds):
        async with lock as lease:
            entered = time.monotonic()
            try:
                fd: int | None = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                fd = None
            await asyncio.sleep(0.002)
            left = time.monotonic()
            if fd is not None:
                os.close(fd)
                os.unlink(marker)
            state = "ok" if fd is not None else "OVERLAP"
            _append(log, f"{lease.token} {pid} {entered:.6f} {left:.6f} {state}\n")
        await asyncio.sleep(random.uniform(0, 0.004))
    print("done", flush=True)


async def serve(client: aiodlock.Client, name: str) -> None:
    loop = asyncio.get_running_loop()
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


async def run(mode: str, url: str, name: str, args: list[str]) -> None:
    positional = [a for a in args if "=" not in a]
    options = dict(a.split("=", 1) for a in args if "=" in a)
    async with aiodlock.connect(url, **options) as client:
        if mode == "hold":
            await hold(client, name)
        elif mode == "cycles":
            await cycles(client, name, int(positional[0]), positional[1])
        elif mode == "serve":
            await serve(client, name)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    mode, url, name, *rest = sys.argv[1:]
    asyncio.run(run(mode, url, name, rest))
