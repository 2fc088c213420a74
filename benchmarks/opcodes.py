"""Python bytecodes executed per lock cycle, by function: where the client's time goes.

``python -m benchmarks.opcodes`` (a few seconds; no valgrind needed) starts fresh
redis-servers (one for ``--backend redis``, five for ``--backend redlock``), makes 200 warm-up
acquire + release cycles through the public API, then counts the bytecodes the interpreter
executes during ``--cycles`` more (``sys.settrace`` with opcode events) and prints, per
cycle, the total, the total per source file and the functions that execute the most.

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


async def count(url: str, cycles: int, warm_up: int = 200) -> collections.Counter[Key]:
    """Opcodes executed during ``cycles`` acquire + release cycles on one name."""
    import aiodlock

    async with aiodlock.connect(url) as client:
        lock = client.lock("opcodes")
        for _ in range(warm_up):
            await lock.acquire()
            await lock.release()
        counter = _Counter()
        sys.settrace(counter)
        try:
            for _ in range(cycles):
                await lock.acquire()
                await lock.release()
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
    args = parser.parse_args(argv)
    n = 5 if args.backend == "redlock" else 1
    servers = temporary_server("redis", lambda s, base: s.RedisGroup(base, n), "aiodlock-opcodes-")
    with servers as group:
        url = f"{args.backend}://" + ",".join(f"{m.host}:{m.port}" for m in group)
        counts = asyncio.run(count(url, args.cycles))
    print(report(counts, args.cycles, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
