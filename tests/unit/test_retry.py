"""The core's retry helpers (aiodlock._retry), on no server: coroutines that fail N times;
and its record of sessions in doubt."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from aiodlock import BackendError, BackendTimeout
from aiodlock._retry import Guaranteed, InDoubt, Pauses, retrying


def transient(text: str = "down") -> BackendError:
    error = BackendError(text)
    error.transient = True
    return error


class Flaky:
    """An attempt that fails ``failures`` times with ``error()``, then returns ``result``."""

    def __init__(self, failures: int, error: type[BackendError] | None = None) -> None:
        self.failures = failures
        self.error = error
        self.runs = 0
        self.times: list[float] = []

    async def __call__(self) -> str:
        self.runs += 1
        self.times.append(time.monotonic())
        await asyncio.sleep(0)
        if self.runs <= self.failures:
            raise transient(f"failure {self.runs}") if self.error is None else self.error("no")
        return "done"


# -- Pauses ------------------------------------------------------------------------------------


def test_pauses_are_capped_jittered_and_end_at_the_limit_or_the_deadline() -> None:
    pauses = Pauses(10.0, first=0.1, cap=0.4)
    seen = [pauses.pause(transient()) for _ in range(6)]
    assert 0.05 <= seen[0] <= 0.1
    assert all(0 < p <= 0.4 for p in seen)
    assert max(seen[3:]) >= 0.2  # grown to the cap's range
    error = transient()
    with pytest.raises(BackendError) as info:
        pauses.pause(error, deadline=time.monotonic() - 1)
    assert info.value is error
    assert pauses.end(None) is not None
    assert Pauses().end(None) is None
    assert Pauses().end(5.0) == 5.0
    with pytest.raises(BackendError):
        Pauses(0.0).pause(transient())


def test_a_pause_never_outlasts_the_deadline() -> None:
    deadline = time.monotonic() + 0.01
    assert Pauses(first=5.0, cap=5.0).pause(transient(), deadline) <= 0.01


# -- retrying ------------------------------------------------------------------------------------


async def test_retrying_runs_again_until_the_attempt_succeeds() -> None:
    attempt = Flaky(3)
    assert await retrying(attempt, until=time.monotonic() + 5, first=0.001, cap=0.002) == "done"
    assert attempt.runs == 4


async def test_a_failure_that_is_not_transient_is_raised_at_once() -> None:
    attempt = Flaky(3, error=BackendError)
    with pytest.raises(BackendError, match="no"):
        await retrying(attempt, first=0.001)
    assert attempt.runs == 1


async def test_other_exceptions_pass_through() -> None:
    runs = 0

    async def attempt() -> None:
        nonlocal runs
        runs += 1
        raise KeyError("x")

    with pytest.raises(KeyError):
        await retrying(attempt, first=0.001)
    assert runs == 1


async def test_retrying_gives_up_after_tries_with_the_last_error() -> None:
    attempt = Flaky(10)
    with pytest.raises(BackendError, match="failure 3"):
        await retrying(attempt, tries=3, first=0.0)
    assert attempt.runs == 3


async def test_first_zero_runs_again_at_once() -> None:
    attempt = Flaky(4)
    began = time.monotonic()
    assert await retrying(attempt, tries=5, first=0.0, cap=0.0) == "done"
    assert time.monotonic() - began < 0.5


async def test_retrying_gives_up_at_the_deadline() -> None:
    attempt = Flaky(1000)
    began = time.monotonic()
    with pytest.raises(BackendError, match="failure"):
        await retrying(attempt, until=began + 0.2, first=0.01, cap=0.02)
    elapsed = time.monotonic() - began
    assert 0.2 <= elapsed < 2.0
    assert attempt.runs >= 5


async def test_retrying_gives_up_when_failures_last_the_limit() -> None:
    attempt = Flaky(1000)
    began = time.monotonic()
    with pytest.raises(BackendError):
        await retrying(attempt, limit=0.2, first=0.01, cap=0.02)
    assert 0.2 <= time.monotonic() - began < 2.0


async def test_pauses_grow_and_stay_under_the_cap() -> None:
    attempt = Flaky(6)
    await retrying(attempt, first=0.01, cap=0.04)
    gaps = [b - a for a, b in zip(attempt.times, attempt.times[1:], strict=False)]
    assert len(gaps) == 6
    assert all(gap < 0.5 for gap in gaps)
    assert max(gaps[3:]) >= 0.02


async def test_retry_if_picks_the_failures_that_are_tried_again() -> None:
    attempt = Flaky(2, error=BackendTimeout)  # transient, but not what retry_if accepts
    with pytest.raises(BackendTimeout):
        await retrying(attempt, first=0.001, retry_if=lambda e: not isinstance(e, TimeoutError))
    assert attempt.runs == 1
    attempt = Flaky(2, error=BackendError)  # not transient, but accepted
    assert await retrying(attempt, first=0.001, retry_if=lambda e: True) == "done"
    assert attempt.runs == 3


class Ready:
    """A ``wait_ready`` that says ready at once and records the end it was given."""

    def __init__(self) -> None:
        self.ends: list[float | None] = []

    async def __call__(self, end: float | None) -> bool:
        self.ends.append(end)
        return True


async def test_wait_ready_replaces_the_pause() -> None:
    attempt = Flaky(3)
    ready = Ready()
    ends = ready.ends
    began = time.monotonic()
    result = await retrying(attempt, until=began + 5, limit=1.0, wait_ready=ready, first=10.0)
    assert result == "done"
    assert attempt.runs == 4
    assert len(ends) == 3
    # each wait is bounded by the limit from its failure, and by the deadline
    assert all(end is not None and began < end <= began + 1.5 for end in ends)
    assert time.monotonic() - began < 1.0  # no pause of 10 s


async def test_wait_ready_false_gives_up_with_the_last_error() -> None:
    attempt = Flaky(5)

    async def never(end: float | None) -> bool:
        return False

    with pytest.raises(BackendError, match="failure 1"):
        await retrying(attempt, wait_ready=never)
    assert attempt.runs == 1


async def test_wait_ready_without_limit_or_deadline_waits_without_end() -> None:
    ready = Ready()
    assert await retrying(Flaky(1), wait_ready=ready) == "done"
    assert ready.ends == [None]


# -- Guaranteed -------------------------------------------------------------------------------


async def test_guaranteed_runs_an_action_now() -> None:
    cleanup = Guaranteed(pauses=(0.001, 1.0))
    attempt = Flaky(2)
    assert await cleanup.run("k", attempt, until=time.monotonic() + 5) == "done"
    assert attempt.runs == 3
    assert len(cleanup) == 0
    await cleanup.aclose()


async def test_guaranteed_keeps_what_did_not_succeed_in_time_and_finishes_it() -> None:
    cleanup = Guaranteed(pauses=(0.01, 0.02))
    attempt = Flaky(8)
    with pytest.raises(BackendError):
        await cleanup.run("node", attempt, until=time.monotonic() + 0.03)
    assert "node" in cleanup
    runs = attempt.runs
    async with asyncio.timeout(5):
        while "node" in cleanup:
            await asyncio.sleep(0.005)
    assert attempt.runs == 9 > runs
    await cleanup.aclose()


async def test_guaranteed_keeps_an_action_whose_caller_was_cancelled() -> None:
    cleanup = Guaranteed(pauses=(0.001, 1.0))
    started = asyncio.Event()
    release = asyncio.Event()
    runs = 0

    async def action() -> None:
        nonlocal runs
        runs += 1
        started.set()
        if runs == 1:
            await release.wait()

    task = asyncio.create_task(cleanup.run("k", action, until=None))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "k" in cleanup or runs == 2
    async with asyncio.timeout(5):
        while "k" in cleanup:
            await asyncio.sleep(0.005)
    assert runs == 2
    await cleanup.aclose()


async def test_forget_drops_a_kept_action() -> None:
    cleanup = Guaranteed(pauses=(10.0, 10.0))  # (the background waits after its first run)
    await cleanup.forget("nothing")  # (nothing kept: at once)
    runs = 0

    async def action() -> None:
        nonlocal runs
        runs += 1
        raise transient()

    assert cleanup.later("k", action)
    async with asyncio.timeout(5):
        while runs < 1:  # (the background's first run fails)
            await asyncio.sleep(0.001)
    await cleanup.forget("k")
    assert "k" not in cleanup
    assert runs == 1  # (not run again)
    await cleanup.aclose()


async def test_forget_waits_for_the_backgrounds_run_under_way() -> None:
    """A clean-up must not run on after forget() returned (it could undo what follows)."""
    cleanup = Guaranteed(pauses=(0.001, 1.0))
    started, finish = asyncio.Event(), asyncio.Event()
    runs, done = 0, 0

    async def action() -> None:
        nonlocal runs, done
        runs += 1
        started.set()
        await finish.wait()
        done += 1
        raise transient()  # (it failed: yet it is not run again)

    cleanup.later("k", action)
    await started.wait()
    forgetting = asyncio.create_task(cleanup.forget("k"))
    await asyncio.sleep(0.01)
    assert not forgetting.done()
    finish.set()
    async with asyncio.timeout(5):
        await forgetting
    assert (runs, done) == (1, 1)
    assert "k" not in cleanup
    await asyncio.sleep(0.02)
    assert runs == 1
    await cleanup.aclose()


async def test_later_keeps_one_action_per_key() -> None:
    cleanup = Guaranteed(pauses=(0.001, 1.0))
    gate = asyncio.Event()
    calls: list[str] = []

    async def action(tag: str) -> None:
        calls.append(tag)
        await gate.wait()

    assert cleanup.later("k", lambda: action("first"))
    assert not cleanup.later("k", lambda: action("second"))
    assert len(cleanup) == 1
    gate.set()
    async with asyncio.timeout(5):
        while len(cleanup):
            await asyncio.sleep(0.005)
    assert calls == ["first"]
    await cleanup.aclose()


async def test_kick_ends_the_pause_at_once() -> None:
    cleanup = Guaranteed(pauses=(30.0, 30.0))  # a pause that would outlast the test
    attempt = Flaky(1)
    cleanup.later("k", attempt)
    async with asyncio.timeout(5):
        while attempt.runs < 1:
            await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    assert attempt.runs == 1  # pausing
    cleanup.kick()
    async with asyncio.timeout(5):
        while "k" in cleanup:
            await asyncio.sleep(0.005)
    assert attempt.runs == 2
    await cleanup.aclose()


async def test_background_waits_until_ready_and_stops_when_it_never_will_be() -> None:
    ready = asyncio.Event()
    closing = False

    async def wait_ready(end: float | None) -> bool:
        assert end is None
        await ready.wait()
        return not closing

    cleanup = Guaranteed(wait_ready=wait_ready, pauses=(0.001, 1.0))
    attempt = Flaky(0)
    cleanup.later("k", attempt)
    await asyncio.sleep(0.05)
    assert attempt.runs == 0  # not ready: nothing is tried
    ready.set()
    async with asyncio.timeout(5):
        while "k" in cleanup:
            await asyncio.sleep(0.005)
    assert attempt.runs == 1
    # never ready again: the background task ends, the action stays kept
    ready.clear()
    closing = True
    other = Flaky(0)
    cleanup.later("other", other)
    ready.set()
    await asyncio.sleep(0.05)
    assert other.runs == 0
    assert "other" in cleanup
    await cleanup.aclose()


async def test_failures_that_are_not_transient_are_logged_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cleanup = Guaranteed("delete", pauses=(0.001, 0.002))
    attempt = Flaky(2, error=BackendError)
    with caplog.at_level(logging.WARNING, logger="aiodlock"):
        cleanup.later("node", attempt)
        async with asyncio.timeout(5):
            while "node" in cleanup:
                await asyncio.sleep(0.005)
    assert attempt.runs == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "delete 'node' failed" in warnings[0].getMessage()
    await cleanup.aclose()


async def test_transient_failures_in_the_background_are_not_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (retry_if picks no failure here: the foreground would raise at once, but the
    # background tries again quietly after a transient one, e.g. a timeout)
    cleanup = Guaranteed("delete", retry_if=lambda e: False, pauses=(0.001, 0.002))
    attempt = Flaky(3, error=BackendTimeout)
    with caplog.at_level(logging.WARNING, logger="aiodlock"):
        cleanup.later("node", attempt)
        async with asyncio.timeout(5):
            while "node" in cleanup:
                await asyncio.sleep(0.005)
    assert attempt.runs == 4
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    await cleanup.aclose()


async def test_aclose_drops_what_is_kept_and_ends_every_task() -> None:
    cleanup = Guaranteed(pauses=(30.0, 30.0))
    attempt = Flaky(1000)
    cleanup.later("k", attempt)
    own = cleanup.spawn(asyncio.sleep(3600), "an owner's task")
    async with asyncio.timeout(5):
        while attempt.runs < 1:
            await asyncio.sleep(0.005)
    await cleanup.aclose()
    assert cleanup.closed
    assert len(cleanup) == 0
    assert own.cancelled()
    assert not cleanup.later("k2", attempt)  # closed: nothing more is kept
    runs = attempt.runs
    await asyncio.sleep(0.02)
    assert attempt.runs == runs


async def test_spawned_tasks_are_forgotten_when_done() -> None:
    cleanup = Guaranteed()
    task = cleanup.spawn(asyncio.sleep(0), "quick")
    await task
    await asyncio.sleep(0)
    await cleanup.aclose()
    assert task.done()
    assert not task.cancelled()


# -- InDoubt -----------------------------------------------------------------------------------


def test_in_doubt_keeps_the_newest_sessions_in_the_order_noted() -> None:
    bounded: InDoubt[int] = InDoubt(keep=3)
    assert not bounded
    for session in range(1, 6):
        bounded.note(session)
    assert len(bounded) == 3
    assert bounded.recent() == [3, 4, 5]  # (the oldest went)
    unbounded: InDoubt[int] = InDoubt()
    for session in range(100):
        unbounded.note(session)
    assert unbounded.recent() == list(range(100))


async def test_in_doubt_gives_the_recent_ones_and_take_forgets_the_older_too() -> None:
    doubt: InDoubt[str] = InDoubt()
    doubt.note("old")
    await asyncio.sleep(0.2)
    doubt.note("new")
    assert doubt.recent(0.1) == ["new"]
    assert doubt.recent() == ["old", "new"]
    assert doubt.take(0.1) == ["new"]
    assert not doubt  # ("old" too: too old to be told apart from a later session)
    assert doubt.take() == []


def test_in_doubt_forgets_only_the_sessions_settled() -> None:
    doubt: InDoubt[tuple[int, str]] = InDoubt(keep=2)
    doubt.note((1, "a"))
    settling = doubt.recent()
    doubt.note((2, "b"))  # (noted while the first one was being ended)
    doubt.forget(settling)
    assert doubt.recent() == [(2, "b")]
    doubt.note((3, "c"))
    doubt.note((4, "d"))
    assert doubt.recent() == [(3, "c"), (4, "d")]  # (still at most 2)
    doubt.forget()
    assert not doubt
