"""User-space instructions per Redlock cycle, counted by valgrind: a noise-free reading.

Wall-clock and CPU-time readings on a shared 2-vCPU machine move by 10-20% from one minute to
the next; the number of instructions the client executes per cycle does not (two runs of the
same code agree to 0.1%).  That makes it the yardstick for the client's own cost while the
wall-clock ratios of ``python -m benchmarks.redlock`` stay the judge of the targets.

``python -m benchmarks.instructions`` (~2 minutes; needs ``valgrind``, Debian package
``valgrind``) starts five fresh redis-servers, then runs a child Python under
``valgrind --tool=callgrind`` twice: ``--short`` and ``--long`` acquire + release cycles on
one name, after the same start-up.  The difference of the two totals divided by the
difference of the cycle counts is what one cycle costs, start-up and shutdown cancelled out.

Variants (``--variant``, several allowed):

- ``lib``: ``client.lock(name)``, ``acquire()`` + ``release()`` (the public API);
- ``backend``: the backend's ``try_acquire`` + ``release`` without the core;
- ``bare``: the same two scripts written to the five connections' pipes with a quorum
  counted in a plain callback: what the transport costs with no library logic at all.

Only the client process is counted (the servers run natively); valgrind slows the client
about 50-fold, so replies are all in before it looks: paths that depend on timing (a node
still unanswered when the majority decided) are not exercised here.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .server import log, temporary_server

VARIANTS = ("lib", "backend", "bare")


async def _child(url: str, variant: str, cycles: int) -> None:
    import aiodlock
    from aiodlock._types import Request
    from aiodlock.backends.redis._scripts import ACQUIRE, RELEASE, LockKeys
    from aiodlock.backends.redis._wire import ScriptCall

    async with aiodlock.connect(url) as client:
        lock = client.lock("instructions")
        owner = (await lock.acquire()).owner  # (this task's owner string)
        await lock.release()
        if variant == "lib":
            for _ in range(cycles):
                await lock.acquire()
                await lock.release()
            return
        backend = client.backend
        if variant == "backend":
            request = Request("instructions-backend", owner, 30.0)
            for _ in range(cycles):
                grant = await backend.try_acquire(request, will_wait=True)
                await backend.release(grant)  # type: ignore[arg-type]
            return
        keys = LockKeys(client.config.namespace, "instructions-bare")
        lock_keys = (keys.lock, keys.counter, keys.queue, keys.deadlines)
        acquire = ScriptCall(ACQUIRE, lock_keys, (owner, 30000))
        release = ScriptCall(
            RELEASE,
            (keys.lock, keys.queue, keys.deadlines),
            (owner, "", keys.channel, keys.waiter_prefix),
        )
        pipes = [node.link.pipe for node in backend.nodes]  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()
        quorum = len(pipes) // 2 + 1
        for _ in range(cycles):
            for call in (acquire, release):
                counted = _Quorum(loop.create_future(), quorum)
                for pipe in pipes:
                    pipe.send_one(call.data, counted)
                await counted.done


class _Quorum:
    """A reply callback that resolves ``done`` at the ``need``-th reply."""

    __slots__ = ("count", "done", "need")

    def __init__(self, done: asyncio.Future[None], need: int) -> None:
        self.done = done
        self.need = need
        self.count = 0

    def __call__(self, reply: object) -> None:
        self.count += 1
        if self.count == self.need and not self.done.done():
            self.done.set_result(None)


def _count(url: str, variant: str, cycles: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            url,
            variant,
            str(cycles),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from valgrind: {done.stderr[-500:]}")
        return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        url, variant, cycles = argv[1], argv[2], int(argv[3])
        asyncio.run(_child(url, variant, cycles))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    parser.add_argument("--short", type=int, default=300)
    parser.add_argument("--long", type=int, default=1300)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.long <= args.short:
        parser.error("--long must be more cycles than --short")
    variants = args.variant or list(VARIANTS)
    five = temporary_server("redis", lambda s, base: s.RedisGroup(base, 5), "aiodlock-instr-")
    with five as group:
        url = "redlock://" + ",".join(f"{member.host}:{member.port}" for member in group)
        print("| variant | instructions per acquire + release cycle |\n|---|---:|")
        for variant in variants:
            log(f"  {variant}: {args.short} and {args.long} cycles under callgrind")
            short = _count(url, variant, args.short)
            long = _count(url, variant, args.long)
            print(f"| {variant} | {(long - short) / (args.long - args.short):,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
