"""``benchmarks.paired``: every loop runs once per round, in an order that turns each round,
and the ratio is taken within each round.  Nothing is timed: the loops are counters."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.paired import Slice, paired_ratio, run_paired, timed


def test_each_round_runs_every_loop_once_in_a_turning_order() -> None:
    calls: list[str] = []

    def loop(name: str, cycles: int) -> Slice:
        async def run(seconds: float) -> int:
            calls.append(name)
            return cycles

        return run

    loops = {"floor": loop("floor", 10), "ours": loop("ours", 8), "peer": loop("peer", 5)}
    rates = asyncio.run(run_paired(loops, rounds=4, seconds=0.01))
    assert calls[:3] == ["floor", "ours", "peer"]  # (the unmeasured first slice of each)
    rounds = [calls[3 + 3 * i : 6 + 3 * i] for i in range(4)]
    assert [r[0] for r in rounds] == ["floor", "ours", "peer", "floor"]
    assert all(sorted(r) == ["floor", "ours", "peer"] for r in rounds)
    assert {name: len(values) for name, values in rates.items()} == {
        "floor": 4,
        "ours": 4,
        "peer": 4,
    }


def test_the_ratio_is_taken_within_each_round() -> None:
    # The machine doubles its speed after two rounds: paired, the ratio stays 0.8.
    floor = [100.0, 100.0, 200.0, 200.0, 200.0]
    ours = [80.0, 80.0, 160.0, 160.0, 160.0]
    assert paired_ratio(ours, floor) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        paired_ratio(ours, floor[:-1])  # (a round without both slices is a bug)


def test_timed_repeats_the_cycle_for_the_slice() -> None:
    done = 0

    async def cycle() -> None:
        nonlocal done
        done += 1
        await asyncio.sleep(0)

    n = asyncio.run(timed(cycle)(0.05))
    assert n == done > 0
