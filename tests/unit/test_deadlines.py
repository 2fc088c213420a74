"""The core's deadlines for many short calls on one loop timer (aiodlock._deadlines)."""

from __future__ import annotations

import asyncio

from aiodlock._deadlines import Deadlines


async def test_a_call_past_its_deadline_is_expired_once() -> None:
    deadlines = Deadlines()
    expired: list[str] = []
    bound = deadlines.start(0.05, lambda: expired.append("a"))
    await asyncio.sleep(0.15)
    assert expired == ["a"]
    assert bound.expired
    deadlines.end(bound)  # (ending an expired call is harmless)
    await asyncio.sleep(0.05)
    assert expired == ["a"]


async def test_calls_that_end_in_time_never_expire() -> None:
    deadlines = Deadlines()
    expired: list[int] = []
    for i in range(100):
        bound = deadlines.start(0.05, lambda i=i: expired.append(i))
        await asyncio.sleep(0)
        deadlines.end(bound)
        assert not bound.expired
    await asyncio.sleep(0.1)
    assert expired == []


async def test_each_call_expires_at_its_own_deadline() -> None:
    """The timer armed for an earlier call that ended in time fires, finds nothing due, and
    is armed again for the calls still in flight."""
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    started = loop.time()
    at: dict[str, float] = {}
    first = deadlines.start(0.05, lambda: at.setdefault("first", loop.time()))
    deadlines.start(0.2, lambda: at.setdefault("second", loop.time()))
    deadlines.start(0.1, lambda: at.setdefault("third", loop.time()))
    deadlines.end(first)
    await asyncio.sleep(0.35)
    assert set(at) == {"second", "third"}
    assert 0.09 <= at["third"] - started < 0.19
    assert 0.19 <= at["second"] - started < 0.3


async def test_cancel_forgets_every_call() -> None:
    deadlines = Deadlines()
    expired: list[int] = []
    bound = deadlines.start(0.05, lambda: expired.append(1))
    deadlines.cancel()
    await asyncio.sleep(0.1)
    assert expired == []
    assert not bound.expired
