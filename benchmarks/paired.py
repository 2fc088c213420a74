"""Paired slices: compare uncontended loops on a machine whose speed drifts.

A shared VM's speed changes from one second to the next (measured here: a floor that ran at
843 and 1,407 cycles/s within a minute).  Long runs one after the other compare the machine
at two moments, not the two loops.  So each loop runs in short slices, one slice of each per
round, in an order that turns every round, and a ratio is taken within each round (slices a
fraction of a second apart), then the median over the rounds.

Each loop stays open across its slices (its connections, its client): a slice measures
cycles only.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["Slice", "paired_ratio", "progress_due", "rotations", "run_paired", "timed"]

T = TypeVar("T")

#: One loop: run cycles for about ``seconds``, return how many it did.
Slice = Callable[[float], Awaitable[int]]


def timed(cycle: Callable[[], Awaitable[Any]]) -> Slice:
    """A :data:`Slice` of ``cycle()`` (one acquire and release) repeated."""

    async def run(seconds: float) -> int:
        n, end, clock = 0, time.perf_counter() + seconds, time.perf_counter
        while clock() < end:
            await cycle()
            n += 1
        return n

    return run


def rotations(names: Sequence[T], rounds: int) -> Iterator[tuple[int, list[T]]]:
    """``(turn, order)`` for each of ``rounds`` rounds: every name once, in an order turned
    by one every round (no loop always runs first, or always after the same one).  Each round
    starts with a ``gc.collect()``: no collection of the previous round's garbage inside it."""
    for turn in range(rounds):
        gc.collect()
        k = turn % max(len(names), 1)
        yield turn, [*names[k:], *names[:k]]


def progress_due(turn: int, rounds: int) -> bool:
    """Whether a progress line is due after round ``turn`` (four in a run, and the last)."""
    return (turn + 1) % max(rounds // 4, 1) == 0 or turn + 1 == rounds


async def run_paired(
    loops: Mapping[str, Slice],
    *,
    rounds: int,
    seconds: float,
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Cycles per second of each loop, one slice per round (index: the round)."""
    names = list(loops)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # (a first, unmeasured slice: connections, statement caches)
        await loops[name](min(seconds, 0.2))
    for turn, order in rotations(names, rounds):
        for name in order:
            started = time.perf_counter()
            n = await loops[name](seconds)
            rates[name].append(n / (time.perf_counter() - started))
        if progress is not None and progress_due(turn, rounds):
            line = ", ".join(f"{n} {statistics.median(rates[n]):.0f}" for n in names)
            progress(f"after {turn + 1}/{rounds} rounds, median cycles/s: {line}")
    return rates


def paired_ratio(mine: Sequence[float], reference: Sequence[float]) -> float:
    """The median over rounds of ``mine / reference`` within each round."""
    return statistics.median(a / b for a, b in zip(mine, reference, strict=True) if b)
