"""Python bytecodes executed per lock cycle, by function: where the client's time goes.

``python -m benchmarks.opcodes`` (a few seconds; no valgrind needed) starts fresh
redis-servers (one for ``--backend redis``, five for ``--backend redlock``), makes 200 warm-up
acquire + release cycles through the public API, then counts the bytecodes the interpreter
executes during ``--cycles`` more (``sys.settrace`` with opcode events) and prints, per
cycle, the total, the total per source file and the functions that execute the most.
``--tasks N``: N tasks of one client contend for the name (each yields once inside); the
counts are then per contended acquisition.

The count is nearly independent of the machine's speed (only paths that depend on timing,
such as how many replies one read brings, move it), which makes it a quick yardstick for
changes to the hot path; ``python -m benchmarks.instructions`` counts machine instructions
instead (callgrind: slower, and it includes the C work).  Tracing slows the client about
tenfold, so the servers have always answered before the client looks: it sees the
"replies are all in" path, as callgrind does.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from types import FrameType
from typing import Any

from .server import temporary_server

Key = tuple[str, str, int]


class _Counter:
    """A ``sys.settrace`` function counting opcode events by (file, function, line)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[Key] = collections.Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            self.counts[
                (code.co_filename.rsplit("/", 1)[-1], code.co_name, code.co_firstlineno)
            ] += 1
        return self


async def count(
    url: str, cycles: int, warm_up: int = 200, tasks: int = 1
) -> collections.Counter[Key]:
    """Opcodes executed during ``cycles`` acquire + release cycles on one name, made by
    ``tasks`` tasks of one client that contend for it (``cycles`` in all)."""
    import aiodlock

    async with aiodlock.connect(url) as client:
        lock = client.lock("opcodes")
        left = [warm_up]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await lock.acquire()
                if tasks > 1:
                    await asyncio.sleep(0)  # (inside: let the others queue up)
                await lock.release()

        async def run(n: int) -> None:
            left[0] = n
            await asyncio.gather(*(worker() for _ in range(tasks)))

        await run(warm_up)
        counter = _Counter()
        sys.settrace(counter)
        try:
            await run(cycles)
        finally:
            sys.settrace(None)
    return counter.counts


def report(counts: collections.Counter[Key], cycles: int, top: int) -> str:
    total = sum(counts.values())
    by_file: collections.Counter[str] = collections.Counter()
    for (file, _, _), n in counts.items():
        by_file[file] += n
    lines = [f"opcodes per cycle: {total / cycles:,.0f}", "", "| file | per cycle |", "|---|---:|"]
    lines += [f"| {file} | {n / cycles:,.1f} |" for file, n in by_file.most_common()]
    lines += ["", "| function | per cycle |", "|---|---:|"]
    lines += [
        f"| {file}:{line} {name} | {n / cycles:,.1f} |"
        for (file, name, line), n in counts.most_common(top)
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.opcodes", description=__doc__)
    parser.add_argument("--backend", choices=("redis", "redlock"), default="redlock")
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--tasks",
        type=int,
        default=1,
        help="tasks of one client contending for the name (default 1: no contention)",
    )
    args = parser.parse_args(argv)
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    n = 5 if args.backend == "redlock" else 1
    servers = temporary_server("redis", lambda s, base: s.RedisGroup(base, n), "aiodlock-opcodes-")
    with servers as group:
        url = f"{args.backend}://" + ",".join(f"{m.host}:{m.port}" for m in group)
        counts = asyncio.run(count(url, args.cycles, tasks=args.tasks))
    print(report(counts, args.cycles, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
