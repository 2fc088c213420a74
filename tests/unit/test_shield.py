"""``finish``: work that runs to its end although its caller is cancelled, natively, again
and again (an anyio shield holds off anyio's cancellation only)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aiodlock._shield import finish


async def _cancel_twice(task: asyncio.Task[None]) -> None:
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.sleep(0.02)
    task.cancel()  # (while the clean-up runs)


async def test_the_work_ends_although_its_caller_is_cancelled_twice() -> None:
    log: list[str] = []

    async def clean_up() -> None:
        await asyncio.sleep(0.1)
        log.append("cleaned")

    async def body() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await finish(clean_up())
            log.append("after")  # (never: the caller's cancellation is raised)

    task = asyncio.create_task(body())
    await _cancel_twice(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cleaned"]


async def test_an_anyio_shield_does_not_hold_off_a_native_cancel() -> None:
    # (why finish exists: the same clean-up under an anyio shield is cut short)
    log: list[str] = []

    async def body() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            with anyio.CancelScope(shield=True):
                await asyncio.sleep(0.1)
                log.append("cleaned")

    task = asyncio.create_task(body())
    await _cancel_twice(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == []


async def test_the_result_or_the_error_of_the_work() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("no")

    assert await finish(answer()) == 42
    with pytest.raises(ValueError, match="no"):
        await finish(fail())


async def test_a_failure_of_the_work_goes_with_the_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail() -> None:
        await asyncio.sleep(0.05)
        raise ValueError("dropped")

    task = asyncio.create_task(finish(fail()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text
