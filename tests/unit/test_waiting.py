"""The wake-up primitives of ``aiodlock._waiting`` (no server involved)."""

from __future__ import annotations

import asyncio
import time

import pytest

from aiodlock._wakeup import Reservations, Wakeup, WakeupBoard


async def test_a_wakeup_set_before_the_wait_returns_at_once() -> None:
    wakeup = Wakeup()
    wakeup.set()
    wakeup.set()  # (idempotent)
    assert wakeup.is_set()
    await asyncio.wait_for(wakeup.wait(), 1.0)
    await asyncio.wait_for(wakeup.wait(0.0), 1.0)


async def test_a_wakeup_set_while_waiting_wakes_the_waiter() -> None:
    wakeup = Wakeup()
    waiter = asyncio.create_task(wakeup.wait(30.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    wakeup.set()
    await asyncio.wait_for(waiter, 1.0)
    assert wakeup.is_set()


async def test_a_timed_wait_ends_unset_after_its_timeout() -> None:
    wakeup = Wakeup()
    started = time.monotonic()
    await wakeup.wait(0.05)
    assert not wakeup.is_set()
    assert 0.04 <= time.monotonic() - started < 2.0
    # and it can be waited on again, then set
    waiter = asyncio.create_task(wakeup.wait())
    await asyncio.sleep(0)
    wakeup.set()
    await asyncio.wait_for(waiter, 1.0)


async def test_a_cancelled_wait_leaves_the_wakeup_usable() -> None:
    wakeup = Wakeup()
    waiter = asyncio.create_task(wakeup.wait(30.0))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not wakeup.is_set()
    wakeup.set()  # no waiter: just the flag
    await asyncio.wait_for(wakeup.wait(), 1.0)


async def test_a_wakeup_has_one_waiter_at_a_time() -> None:
    wakeup = Wakeup()
    first = asyncio.create_task(wakeup.wait())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one task at a time"):
        await wakeup.wait()
    wakeup.set()
    await asyncio.wait_for(first, 1.0)


async def test_the_board_wakes_one_waiter_and_passes_on_an_unused_wakeup() -> None:
    board = WakeupBoard()
    first, second = board.add("n"), board.add("n")
    assert board.count("n") == 2
    assert board.wake_one("n")
    assert first.event.is_set()
    assert not second.event.is_set()
    # the first leaves without consuming it: the second gets it
    board.remove(first)
    assert second.event.is_set()
    board.remove(second)
    assert "n" not in board
    assert not board.wake_one("n")


async def test_a_reservation_bars_others_until_the_woken_waiter_attempts() -> None:
    reservations = Reservations(30.0)
    assert not reservations
    assert reservations.bar("n", woken=False) is None  # nothing reserved: go
    reservations.reserve("n")
    assert reservations
    assert "n" in reservations
    assert reservations.active("n")
    left = reservations.bar("n", woken=False)
    assert left is not None
    assert 29.0 < left <= 30.0  # another task waits, no round trip
    assert reservations.bar("other", woken=False) is None  # other names are not concerned
    assert reservations.bar("n", woken=True) is None  # the woken waiter goes
    assert reservations.active("n")  # ... and its attempt ends it
    reservations.end("n")
    assert not reservations.active("n")
    assert reservations.bar("n", woken=False) is None
    assert not reservations


async def test_a_reservation_lapses_after_its_window() -> None:
    # The woken waiter may be gone (timed out, cancelled): the window bounds the stall.
    reservations = Reservations(0.02)
    reservations.reserve("n")
    await asyncio.sleep(0.05)
    assert not reservations.active("n")
    assert reservations.bar("n", woken=False) is None
    assert "n" not in reservations  # dropped on the way
