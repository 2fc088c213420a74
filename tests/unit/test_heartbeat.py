"""The core's keep-alive task (:class:`aiodlock._wakeup.Heartbeat`) that session-bound
backends (etcd, MySQL's named and row strategies) beat on."""

from __future__ import annotations

import asyncio
import time

from aiodlock._wakeup import Heartbeat

HANG = 20.0


async def test_it_beats_after_each_delay_the_beat_returns_until_none() -> None:
    beats: list[float] = []
    done = asyncio.Event()
    delays = iter([0.05, 0.0, None])

    async def beat() -> float | None:
        beats.append(time.monotonic())
        delay = next(delays)
        if delay is None:
            done.set()
        return delay

    started = time.monotonic()
    heart = Heartbeat(beat, "test")
    heart.start(0.05)
    heart.start(0.0)  # (a running heartbeat goes on as it was)
    await asyncio.wait_for(done.wait(), HANG)
    assert len(beats) == 3
    assert beats[0] - started >= 0.04
    assert beats[1] - beats[0] >= 0.04
    await asyncio.sleep(0.1)
    assert len(beats) == 3  # (None ended it)


async def test_stop_from_inside_a_beat_ends_it_without_cancelling_that_beat() -> None:
    finished = asyncio.Event()
    beats = 0
    heart: Heartbeat

    async def beat() -> float | None:
        nonlocal beats
        beats += 1
        heart.stop()  # (a backend losing its session inside the keep-alive)
        await asyncio.sleep(0)  # not cancelled
        finished.set()
        return 0.0

    heart = Heartbeat(beat, "test")
    heart.start(0.0)
    await asyncio.wait_for(finished.wait(), HANG)
    await asyncio.sleep(0.05)
    assert beats == 1  # (stopped: no beat after it, although it asked for one at once)


async def test_aclose_cancels_a_sleeping_heartbeat_and_waits_for_it() -> None:
    beats = 0

    async def beat() -> float | None:
        nonlocal beats
        beats += 1
        return 0.01

    heart = Heartbeat(beat, "test")
    heart.start(0.0)
    while beats < 2:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(heart.aclose(), HANG)
    seen = beats
    await asyncio.sleep(0.05)
    assert beats == seen
    heart.start(0.0)  # (it can be started again, as after a reopen)
    while beats == seen:
        await asyncio.sleep(0.01)
    heart.stop()
