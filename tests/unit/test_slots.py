"""Slots: at most n holders, a free slot taken without waiting, waiters served in order, and
no slot lost to a waiter's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from aiodlock._slots import Slots


async def _waiting(slots: Slots, order: list[str], name: str) -> None:
    await slots.take()
    order.append(name)


async def _line(names: str) -> tuple[Slots, list[str], list[asyncio.Task[None]]]:
    """One slot, taken; a task per name waiting for it, in that order."""
    slots = Slots(1)
    assert slots.take_now()
    order: list[str] = []
    tasks = [asyncio.create_task(_waiting(slots, order, n)) for n in names]
    await asyncio.sleep(0)  # (all of them wait)
    return slots, order, tasks


async def test_a_free_slot_is_taken_at_once_and_none_past_the_size() -> None:
    slots = Slots(2)
    assert slots.take_now()
    assert slots.take_now()
    assert not slots.take_now()
    slots.give()
    assert slots.take_now()


async def test_waiters_are_served_in_order_and_none_is_passed_by_a_newcomer() -> None:
    slots, order, tasks = await _line("abc")
    slots.give()
    assert not slots.take_now()  # (the slot went to "a", not to whoever asks now)
    await asyncio.sleep(0)
    assert order == ["a"]
    slots.give()
    await asyncio.sleep(0)
    slots.give()
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c"]
    slots.give()
    assert slots.take_now()


async def test_a_waiter_cancelled_before_its_turn_leaves_the_line() -> None:
    slots, order, (first, second) = await _line("12")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    slots.give()
    await asyncio.wait_for(second, 1)
    assert order == ["2"]


async def test_a_waiter_cancelled_as_the_slot_came_passes_it_on() -> None:
    slots, order, (first, second) = await _line("12")
    slots.give()  # (handed to "1", which has not run yet)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # (the slot went on to "2": none was lost)
    assert order == ["2"]
    slots.give()
    assert slots.take_now()
    assert not slots.take_now()


async def test_async_with_takes_and_gives_back() -> None:
    slots = Slots(1)
    async with slots:
        assert not slots.take_now()
    assert slots.take_now()


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Slots(0)
