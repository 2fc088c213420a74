"""The core's policy (reentrancy, watchdog, lost leases, cancellation), on the memory backend."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import pytest

import aiodlock
import aiodlock.testing
from aiodlock import BackendError
from aiodlock._types import Grant, Request, Waiter, client_of
from aiodlock.backends._base import Backend
from aiodlock.backends.memory import MemoryBackend
from tests.helpers import eventually

HANG = 20.0


class CountingMemory(MemoryBackend):
    """The memory backend, counting the calls the core makes (instrumentation, not a fake)."""

    backend_name = "memory"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: dict[str, int] = {}
        self.renew_sizes: list[int] = []

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        self._count("acquire")
        return await super().acquire(request, deadline)

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        self._count("renew")
        self.renew_sizes.append(len(grants))
        return await super().renew(grants, ttl)

    async def release(self, grant: Grant) -> bool:
        self._count("release")
        return await super().release(grant)


def counting_client(space: str | None = None, **options: object) -> aiodlock.Client:
    plain = aiodlock.testing.memory_client(space, **options)
    backend = plain.backend
    assert isinstance(backend, MemoryBackend)
    counting = CountingMemory(backend.space_name, backend.config)
    return aiodlock.Client(counting)


class LoopMemory(MemoryBackend):
    """The memory backend on the core's try-then-wait loop (``acquire`` not overridden), whose
    ``waiter`` the subclasses below replace; ``events`` records what happened to them."""

    backend_name = "memory"
    acquire = Backend.acquire  # type: ignore[assignment]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.events: list[object] = []


LoopT = TypeVar("LoopT", bound=LoopMemory)


class SlowWaiterMemory(LoopMemory):
    """A waiter whose set-up never finishes (a subscription the server never confirms)."""

    def waiter(self, request: Request) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._stuck()

    @contextlib.asynccontextmanager
    async def _stuck(self) -> AsyncIterator[Any]:
        self.events.append("entered")
        try:
            await asyncio.sleep(HANG)
            yield None
        finally:
            self.events.append("cleaned")


class RecordingWaiterMemory(LoopMemory):
    """The default (polling) waiter, recording what each waiter's exit is called with."""

    def waiter(self, request: Request) -> contextlib.AbstractAsyncContextManager[Any]:
        return _RecordingWaiter(self, super().waiter(request))


class _RecordingWaiter:
    def __init__(
        self, backend: RecordingWaiterMemory, inner: contextlib.AbstractAsyncContextManager[Any]
    ) -> None:
        self.backend = backend
        self.inner = inner

    async def __aenter__(self) -> Any:
        return await self.inner.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self.backend.events.append(exc_info[0])
        return await self.inner.__aexit__(*exc_info)


class ListeningWaiterMemory(LoopMemory):
    """Records every attempt and sleep; its waiter says it listens since ``listening_since``
    and takes ``set_up`` seconds to enter (a subscription being confirmed)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.listening_since: float | None = None
        self.set_up = 0.0

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Any:
        self.events.append("attempt")
        return await super().try_acquire(request, will_wait=will_wait)

    def waiter(self, request: Request) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._listening()

    @contextlib.asynccontextmanager
    async def _listening(self) -> AsyncIterator[Any]:
        await asyncio.sleep(self.set_up)
        self.events.append("entered")
        yield _SleepRecorder(self)


class _SleepRecorder(Waiter):
    def __init__(self, backend: ListeningWaiterMemory) -> None:
        self.backend = backend
        self.listening_since = backend.listening_since

    async def wait(self, timeout: float | None) -> bool:
        self.backend.events.append("sleep")
        await asyncio.sleep(0.02 if timeout is None else min(timeout, 0.02))
        return False


class OutageMemory(LoopMemory):
    """Attempts fail with ``error`` while ``failing`` is set (the server unreachable)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.failing = False
        self.error = BackendError("memory: acquire failed: injected")
        self.error.transient = True

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Any:
        if self.failing:
            self.events.append("failed")
            raise self.error
        self.events.append("attempt")
        return await super().try_acquire(request, will_wait=will_wait)


@pytest.fixture
async def client() -> AsyncIterator[aiodlock.Client]:
    async with aiodlock.testing.memory_client() as c:
        yield c


async def test_nested_acquire_makes_no_round_trip() -> None:
    async with counting_client() as client:
        backend = client.backend
        assert isinstance(backend, CountingMemory)
        lock = client.lock("nested")
        async with lock as outer:
            for _ in range(10):
                async with lock as inner:
                    assert inner is outer
        assert backend.calls == {"acquire": 1, "release": 1}


async def test_a_lock_cycle_leaves_no_cyclic_garbage(client: aiodlock.Client) -> None:
    # A finished holding must be freed by reference counting: cyclic garbage per cycle
    # makes the collector's full passes (which stall the loop) come sooner and last longer.
    lock = client.lock("no-garbage")
    for _ in range(20):  # warm up (caches, the watchdog)
        async with lock:
            pass
    gc.collect()
    gc.disable()
    try:
        # More cycles than the watchdog keeps stale heap entries for (it compacts).
        for _ in range(3000):
            async with lock as lease:
                pass
        found = gc.collect()
    finally:
        gc.enable()
    assert found < 100, found
    # A finished lease still answers, from its copy of the final state.
    assert lease.released
    assert not lease.lost
    assert lease.expires_in == 0.0
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(lease.wait_lost(), 0.05)


def on_the_loop(cls: type[LoopT]) -> LoopT:
    """A fresh memory space served by ``cls`` (a :class:`LoopMemory`)."""
    backend = aiodlock.testing.memory_client().backend
    assert isinstance(backend, MemoryBackend)
    return cls(backend.space_name, backend.config)


@contextlib.asynccontextmanager
async def held_by_another_task(client: aiodlock.Client, name: str) -> AsyncIterator[asyncio.Event]:
    """``name`` held by another task of ``client`` until the event is set (or the end)."""
    holding = asyncio.Event()
    done = asyncio.Event()

    async def hold() -> None:
        async with client.lock(name):
            holding.set()
            await done.wait()

    task = asyncio.create_task(hold())
    await holding.wait()
    try:
        yield done
    finally:
        done.set()
        await task


async def test_a_slow_waiter_set_up_does_not_stretch_the_timeout() -> None:
    slow = on_the_loop(SlowWaiterMemory)
    async with aiodlock.Client(slow) as c:
        async with held_by_another_task(c, "slow-waiter"):
            started = time.monotonic()
            with pytest.raises(aiodlock.LockTimeout):
                await c.lock("slow-waiter").acquire(timeout=0.2)
            assert time.monotonic() - started < 2.0  # about the timeout, not the set-up's HANG
            assert slow.events == ["entered", "cleaned"]
        assert await c.lock("slow-waiter").try_acquire() is not None
        await c.lock("slow-waiter").release()


async def test_the_wait_loop_leaves_its_waiter_once_with_what_ended_it() -> None:
    recording = on_the_loop(RecordingWaiterMemory)
    async with aiodlock.Client(recording) as c:
        async with held_by_another_task(c, "waits") as done:
            # Timed out: the waiter is left normally, then LockTimeout is raised.
            with pytest.raises(aiodlock.LockTimeout):
                await c.lock("waits").acquire(timeout=0.05)
            assert recording.events == [None]
            # Cancelled while waiting: the waiter's exit sees the cancellation.
            waiting = asyncio.create_task(c.lock("waits").acquire())
            await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert recording.events == [None, asyncio.CancelledError]
            # Granted after a wait: left normally, once.
            waiting = asyncio.create_task(c.lock("waits").acquire(timeout=5))
            await asyncio.sleep(0.05)
            done.set()
            lease = await waiting
        assert recording.events == [None, asyncio.CancelledError, None]
        assert lease.token > 1
        # (the task that acquired is gone: the client released its lock)
        for _ in range(100):
            if await c.status("waits") is None:
                break
            await asyncio.sleep(0.01)
        assert await c.status("waits") is None


@pytest.mark.parametrize(
    ("since", "asks_twice"),
    [(-math.inf, False), (None, True), (math.inf, True)],
    ids=["listening-before", "cannot-say", "listening-after"],
)
async def test_the_loop_asks_again_before_its_first_sleep_unless_it_was_listening(
    since: float | None, asks_twice: bool
) -> None:
    # A waiter listening since before the first attempt was sent has been woken by any
    # release since: the loop sleeps at once instead of asking again.
    backend = on_the_loop(ListeningWaiterMemory)
    backend.listening_since = since
    async with aiodlock.Client(backend) as c:
        async with held_by_another_task(c, "ask") as done:
            backend.events.clear()
            waiting = asyncio.create_task(c.lock("ask").acquire(timeout=HANG))
            while backend.events.count("sleep") < 2:
                await asyncio.sleep(0.005)
            done.set()
            lease = await waiting
        first = ["attempt", "entered", "attempt", "sleep"] if asks_twice else [
            "attempt", "entered", "sleep", "attempt"
        ]  # fmt: skip
        assert backend.events[:4] == first
        assert backend.events[-1] == "attempt"  # the one that got it
        assert lease.token == 2  # (held by the finished task: the client releases it)


async def test_the_loop_asks_again_when_the_first_answer_ran_out() -> None:
    # "Busy for 50 ms more" (a fixed lease), and the waiter took 150 ms to enter: the
    # holder's lease has ended meanwhile, so the loop asks at once whatever the waiter says.
    backend = on_the_loop(ListeningWaiterMemory)
    backend.listening_since = -math.inf
    backend.set_up = 0.15
    async with aiodlock.Client(backend) as c:
        holder = asyncio.Event()
        done = asyncio.Event()

        async def hold() -> None:
            async with c.lock("ran-out", ttl=0.05, on_lost="ignore"):
                holder.set()
                await done.wait()

        task = asyncio.create_task(hold())
        await holder.wait()
        backend.events.clear()
        lease = await c.lock("ran-out").acquire(timeout=HANG)
        assert backend.events == ["attempt", "entered", "attempt"]
        assert lease.token == 2
        await c.lock("ran-out").release()
        done.set()
        await task


async def waiting_for(c: aiodlock.Client, name: str, **options: Any) -> asyncio.Task[Any]:
    """A task acquiring ``name`` (held by another task), once it sleeps in the wait loop:
    its first attempt and one more were answered "busy"."""
    backend = c.backend
    assert isinstance(backend, OutageMemory)
    backend.events.clear()
    timeout = options.pop("timeout", HANG)
    task = asyncio.create_task(c.lock(name, **options).acquire(timeout=timeout))
    await eventually(lambda: backend.events.count("attempt") >= 2)
    return task


async def test_a_waiter_rides_out_a_transient_outage(caplog: pytest.LogCaptureFixture) -> None:
    # The server stops answering while a task waits, then comes back: the waiter tries
    # again after short pauses and gets the lock when it is released.
    caplog.set_level(logging.DEBUG, logger="aiodlock")
    backend = on_the_loop(OutageMemory)
    async with aiodlock.Client(backend) as c, held_by_another_task(c, "blip") as done:
        waiting = await waiting_for(c, "blip")
        backend.failing = True
        await eventually(lambda: backend.events.count("failed") >= 3)
        assert "waiting for 'blip': memory: acquire failed: injected; trying again" in caplog.text
        assert not waiting.done()
        backend.failing = False
        done.set()
        lease = await asyncio.wait_for(waiting, HANG)
        assert lease.token == 2


async def test_a_waiting_acquire_gives_up_after_its_lease_length_of_outage() -> None:
    backend = on_the_loop(OutageMemory)
    async with aiodlock.Client(backend) as c, held_by_another_task(c, "down"):
        waiting = await waiting_for(c, "down", ttl=0.3)
        backend.failing = True
        started = time.monotonic()
        with pytest.raises(aiodlock.BackendError, match="injected"):
            await asyncio.wait_for(waiting, HANG)
        assert 0.2 < time.monotonic() - started < 2.0  # about the lease (0.3 s)
        assert backend.events.count("failed") >= 2


async def test_a_deadline_during_an_outage_raises_the_backend_error() -> None:
    backend = on_the_loop(OutageMemory)
    async with aiodlock.Client(backend) as c, held_by_another_task(c, "late"):
        waiting = await waiting_for(c, "late", timeout=0.5)
        backend.failing = True
        with pytest.raises(aiodlock.BackendError, match="injected"):
            await asyncio.wait_for(waiting, HANG)
        assert backend.events.count("failed") >= 2


async def test_errors_that_waiting_cannot_cure_are_raised_at_once() -> None:
    backend = on_the_loop(OutageMemory)
    backend.error = BackendError("memory: acquire failed: permanent")  # not transient
    async with aiodlock.Client(backend) as c:
        async with held_by_another_task(c, "bad"):
            waiting = await waiting_for(c, "bad")
            backend.failing = True
            with pytest.raises(aiodlock.BackendError, match="permanent"):
                await asyncio.wait_for(waiting, HANG)
            assert backend.events.count("failed") == 1
        # and a first attempt that fails, transient or not, is raised at once
        backend.error.transient = True
        with pytest.raises(aiodlock.BackendError, match="permanent"):
            await c.lock("bad").acquire(timeout=HANG)
        assert backend.events.count("failed") == 2


async def test_mutual_exclusion_under_many_tasks(client: aiodlock.Client) -> None:
    inside = 0
    count = 0

    async def worker() -> None:
        nonlocal inside, count
        for _ in range(20):
            async with client.lock("many"):
                inside += 1
                assert inside == 1
                await asyncio.sleep(0)
                inside -= 1
                count += 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(50))), HANG)
    assert count == 1000


async def test_fifo_order(client: aiodlock.Client) -> None:
    order: list[int] = []
    lock = client.lock("fifo")
    await lock.acquire()

    async def waiter(i: int) -> None:
        async with client.lock("fifo"):
            order.append(i)

    tasks = []
    for i in range(20):
        tasks.append(asyncio.create_task(waiter(i)))
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    status = await lock.status()
    assert status is not None
    assert status.waiters == 20
    await lock.release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    assert order == list(range(20))


async def test_watchdog_renews_many_locks_in_batches() -> None:
    async with counting_client(watchdog_ttl=1.0) as client:
        backend = client.backend
        assert isinstance(backend, CountingMemory)
        locks = [client.lock(f"bulk-{i}") for i in range(2000)]
        tasks_before = len(asyncio.all_tasks())
        for i, lock in enumerate(locks):
            await lock.acquire()
            if i % 100 == 0:
                # The memory backend never waits on I/O: let the watchdog run, as a real
                # backend's round trips would.
                await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) - tasks_before <= 2  # no task per lock
        await asyncio.sleep(2.5)  # more than two lease lengths, 7 renewal intervals
        leases = [lock.lease for lock in locks]
        lost = [lease.lost_reason for lease in leases if lease is None or lease.lost]
        assert not lost, lost[:3]
        renewed = sum(backend.renew_sizes)
        assert renewed >= 2000 * 2
        # Thousands of renewals in a few batched calls: on average 50+ leases per call.
        assert renewed / backend.calls["renew"] >= 50, backend.renew_sizes
        for lock in locks:
            await lock.release()


async def test_lost_lease_raises_from_nested_with() -> None:
    space = aiodlock.testing.new_space()
    async with (
        aiodlock.testing.memory_client(space, watchdog_ttl=0.3) as client,
        aiodlock.testing.memory_client(space) as admin,
    ):
        lock = client.lock("nested-lost")
        started = time.monotonic()
        with pytest.raises(aiodlock.LockLost):
            async with lock, lock:
                await admin.force_release("nested-lost")  # seen at the next renewal
                await asyncio.sleep(HANG)
        assert time.monotonic() - started < HANG / 2
        assert not lock.held
        assert await lock.try_acquire() is not None
        await lock.release()


async def test_foreign_cancellation_is_not_turned_into_lock_lost(
    client: aiodlock.Client,
) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock("foreign"):
            entered.set()
            await asyncio.sleep(HANG)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.status("foreign") is None


async def test_timeout_outside_is_not_confused_with_loss(client: aiodlock.Client) -> None:
    with pytest.raises(TimeoutError) as info:
        async with asyncio.timeout(0.05), client.lock("outer-timeout"):
            await asyncio.sleep(HANG)
    assert not isinstance(info.value, aiodlock.LockLost)
    assert await client.status("outer-timeout") is None


async def test_fixed_ttl_loss_cancels_body(client: aiodlock.Client) -> None:
    started = time.monotonic()
    with pytest.raises(aiodlock.LockLost, match="fixed ttl"):
        async with client.lock("short", ttl=0.1):
            await asyncio.sleep(HANG)
    assert time.monotonic() - started < HANG / 2


async def test_async_on_lost_callback(client: aiodlock.Client) -> None:
    seen: list[str] = []
    done = asyncio.Event()

    async def on_lost(lease: aiodlock.Lease) -> None:
        seen.append(lease.name)
        done.set()

    async with client.lock("cb", ttl=0.1, on_lost=on_lost) as lease:
        await asyncio.wait_for(done.wait(), HANG)
        assert lease.lost
        assert lease.expires_in == 0.0
    assert seen == ["cb"]


async def test_reacquire_of_lost_lock_needs_release_first(client: aiodlock.Client) -> None:
    lock = client.lock("lost-re", ttl=0.05, on_lost="ignore")
    lease = await lock.acquire()
    await asyncio.wait_for(lease.wait_lost(), HANG)
    assert not lock.held
    with pytest.raises(aiodlock.LockLost):
        await lock.acquire()
    await lock.release()  # on_lost="ignore": no error
    assert await lock.try_acquire() is not None
    await lock.release()


async def test_release_of_lost_lease_raises_with_cancel_policy(client: aiodlock.Client) -> None:
    lock = client.lock("lost-release", ttl=0.05)
    lease = await lock.acquire()
    await asyncio.wait_for(lease.wait_lost(), HANG)
    with pytest.raises(aiodlock.LockLost, match="lost-release"):
        await lock.release()
    with pytest.raises(aiodlock.LockNotOwned):
        await lock.release()


async def test_task_that_ends_holding_a_lock_releases_it(
    client: aiodlock.Client, caplog: pytest.LogCaptureFixture
) -> None:
    async def forgetful() -> aiodlock.Lease:
        return await client.lock("orphan").acquire()

    with caplog.at_level(logging.WARNING, logger="aiodlock"):
        lease = await asyncio.create_task(forgetful())
        for _ in range(100):
            if await client.status("orphan") is None:
                break
            await asyncio.sleep(0.01)
    assert await client.status("orphan") is None
    assert lease.released
    assert any("ended while holding" in r.getMessage() for r in caplog.records)


def _watchers(task: asyncio.Task[Any], client: aiodlock.Client) -> int:
    """How many done-callbacks of ``task`` are methods of ``client``."""
    callbacks = task._callbacks or ()  # type: ignore[attr-defined]
    return sum(1 for cb, _ in callbacks if getattr(cb, "__self__", None) is client)


async def test_a_task_is_watched_once_and_not_after_close() -> None:
    """The task-end watch is one callback per task (not one per hold), removed at close:
    a closed client is not kept alive by a long-lived task, and a re-opened one still
    releases what an ended task held."""
    client = aiodlock.connect("memory://task-watch")
    await client.open()
    lock = client.lock("watched")
    for _ in range(3):
        await lock.acquire()
        await lock.release()
    task = asyncio.current_task()
    assert task is not None
    assert _watchers(task, client) == 1
    await client.close()
    assert _watchers(task, client) == 0

    await client.open()
    try:
        # The same task, the same owner, watched again.
        assert (
            len([cb for cb, _ in task._callbacks if getattr(cb, "__self__", None) is client]) == 1
        )  # type: ignore[attr-defined]
        await lock.acquire()
        assert lock.held
        await lock.release()

        async def forgetful() -> aiodlock.Lease:
            return await client.lock("orphan-again").acquire()

        lease = await asyncio.create_task(forgetful())
        for _ in range(100):
            if lease.released:
                break
            await asyncio.sleep(0.01)
        assert lease.released
        assert await client.status("orphan-again") is None
    finally:
        await client.close()


async def test_observer_sees_events(client: aiodlock.Client) -> None:
    events: list[tuple[str, str]] = []

    class Recorder(aiodlock.Observer):
        def on_acquired(self, lease: aiodlock.Lease, waited: float) -> None:
            assert waited >= 0
            events.append(("acquired", lease.name))

        def on_released(self, lease: aiodlock.Lease, held: float) -> None:
            events.append(("released", lease.name))

        def on_lost(self, lease: aiodlock.Lease, reason: str) -> None:
            events.append(("lost", lease.name))

        def on_timeout(self, name: str, owner: str, waited: float) -> None:
            events.append(("timeout", name))

    class Broken(aiodlock.Observer):
        def on_acquired(self, lease: aiodlock.Lease, waited: float) -> None:
            raise RuntimeError("observer bug")

    client.add_observer(Broken())
    client.add_observer(Recorder())
    async with client.lock("obs"):

        async def contend() -> None:
            with pytest.raises(aiodlock.LockTimeout):
                await client.lock("obs").acquire(timeout=0)

        await asyncio.create_task(contend())
    with pytest.raises(aiodlock.LockLost):
        async with client.lock("obs2", ttl=0.05):
            await asyncio.sleep(HANG)
    assert events == [
        ("acquired", "obs"),
        ("timeout", "obs"),
        ("released", "obs"),
        ("acquired", "obs2"),
        ("lost", "obs2"),
        ("released", "obs2"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
        ({"ttl": "10"}, "ttl"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"fair": "yes"}, "fair"),
        ({"on_lost": "explode"}, "on_lost"),
    ],
)
def test_bad_lock_options(kwargs: dict[str, object], fragment: str) -> None:
    client = aiodlock.testing.memory_client()
    with pytest.raises(aiodlock.ConfigurationError, match=fragment):
        client.lock("x", **kwargs)  # type: ignore[arg-type]


async def test_bad_acquire_timeout(client: aiodlock.Client) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="timeout"):
        await client.lock("x").acquire(timeout=-0.5)


async def test_an_infinite_timeout_is_refused(client: aiodlock.Client) -> None:
    """api.md: seconds are finite; ``timeout=None`` is the way to wait forever."""
    with pytest.raises(aiodlock.ConfigurationError, match="timeout must be finite"):
        client.lock("inf", timeout=float("inf"))
    with pytest.raises(aiodlock.ConfigurationError, match="timeout must be finite"):
        await client.lock("inf").acquire(timeout=float("inf"))
    lock = client.lock("inf", timeout=None)
    async with lock:
        assert lock.held


async def test_decorator_validates_early() -> None:
    client = aiodlock.testing.memory_client()
    with pytest.raises(aiodlock.ConfigurationError, match="not a parameter"):

        @client.locked("job:{missing}")
        async def job(user_id: int) -> None: ...

    with pytest.raises(aiodlock.ConfigurationError, match="async def"):

        @client.locked("job:{x}")
        def sync_job(x: int) -> None: ...

    with pytest.raises(aiodlock.ConfigurationError, match="parameter names"):

        @client.locked("job:{0}")
        async def positional(x: int) -> None: ...

    with pytest.raises(aiodlock.ConfigurationError, match="timeout"):
        client.locked("job", timeout=-1)


async def test_decorator_formats_attributes_defaults_and_callables(
    client: aiodlock.Client,
) -> None:
    names: list[str] = []

    class Order:
        id = 42

    @client.locked("order:{order.id}:{mode}")
    async def ship(order: Order, mode: str = "fast") -> None:
        lease = client.lock(f"order:{order.id}:{mode}").lease
        assert lease is not None
        names.append(lease.name)

    @client.locked(lambda a, b: f"sum:{a + b}")
    async def add(a: int, b: int) -> None:
        names.append("add" if client.lock(f"sum:{a + b}").held else "not held")

    await ship(Order())
    await ship(Order(), mode="slow")
    await add(1, 2)
    assert names == ["order:42:fast", "order:42:slow", "add"]
    assert ship.__name__ == "ship"


async def test_client_opens_itself_and_can_reopen() -> None:
    client = aiodlock.testing.memory_client()
    assert not client.is_open
    async with client.lock("auto"):
        assert client.is_open
    await client.close()
    assert not client.is_open
    async with client, client.lock("auto") as lease:
        assert lease.token == 2


async def test_held_is_per_task_and_false_outside(client: aiodlock.Client) -> None:
    lock = client.lock("held")
    assert not lock.held
    assert lock.lease is None
    async with lock as lease:
        assert lock.held
        assert lock.lease is lease
        assert 0 < (lease.expires_in or 0) <= client.config.watchdog_ttl
        assert "held" in repr(lease)
    assert not lock.held
    assert "released" in repr(lease)
    assert repr(lock) == "<aiodlock.Lock 'held'>"


@pytest.mark.parametrize("steps", range(12))
async def test_cancel_at_every_step_of_a_contended_acquire(steps: int) -> None:
    space = aiodlock.testing.new_space()
    async with (
        aiodlock.testing.memory_client(space) as a,
        aiodlock.testing.memory_client(space) as b,
    ):
        await a.lock("step").acquire()
        task = asyncio.create_task(b.lock("step").acquire())
        for _ in range(steps):
            await asyncio.sleep(0)
        if steps % 3 == 0:
            await a.lock("step").release()  # the grant may race with the cancel
            for _ in range(steps // 3):
                await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if a.lock("step").held:
            await a.lock("step").release()
        for _ in range(50):
            status = await a.status("step")
            if status is None:
                break
            await asyncio.sleep(0.01)
        assert await a.status("step") is None
        assert await a.lock("step").try_acquire() is not None
        await a.lock("step").release()


async def test_memory_spaces_are_independent() -> None:
    async with (
        aiodlock.testing.memory_client() as a,
        aiodlock.testing.memory_client() as b,
    ):
        await a.lock("same").acquire()
        assert await b.lock("same").try_acquire() is not None
        await b.lock("same").release()
        await a.lock("same").release()


async def test_namespaces_are_independent() -> None:
    space = aiodlock.testing.new_space()
    async with (
        aiodlock.testing.memory_client(space, namespace="app1") as a,
        aiodlock.testing.memory_client(space, namespace="app2") as b,
        aiodlock.testing.memory_client(space, namespace="app1") as c,
    ):
        await a.lock("n").acquire()
        assert await b.lock("n").try_acquire() is not None
        assert await c.lock("n").try_acquire() is None
        await b.lock("n").release()
        await a.lock("n").release()


class LateReplyMemory(MemoryBackend):
    """Grants, then takes 0.2 s to say so (a reply on its way); its clean-up of an
    interrupted acquire takes 0.1 s (a round trip)."""

    backend_name = "memory"

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        grant = await super().acquire(request, deadline)
        await asyncio.sleep(0.2)
        return grant

    async def abandon(self, request: Request) -> None:
        await asyncio.sleep(0.1)
        await super().abandon(request)


async def test_a_clean_up_runs_to_its_end_when_the_task_is_cancelled_again() -> None:
    # The acquire is cancelled as its grant comes back, and cancelled again while its
    # clean-up runs: the clean-up still ends, and the name is free (an anyio shield held
    # off neither cancellation: the lock stayed taken for the client's life).
    plain = aiodlock.testing.memory_client()
    assert isinstance(plain.backend, MemoryBackend)
    backend = LateReplyMemory(plain.backend.space_name, plain.backend.config)
    async with aiodlock.Client(backend) as c:
        task = asyncio.create_task(c.lock("twice").acquire())
        await asyncio.sleep(0.1)  # (granted; the reply is on its way)
        task.cancel()
        await asyncio.sleep(0.05)  # (the clean-up runs)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await c.status("twice") is None
        assert await c.lock("twice").try_acquire() is not None
        await c.lock("twice").release()


async def test_client_of_reads_the_client_back_from_either_kind_of_owner() -> None:
    client = aiodlock.connect("memory://")
    async with client, client.lock("a") as by_task, client.lock("b", owner="job:7/x") as by_key:
        assert by_task.owner != by_key.owner
        assert client_of(by_task.owner) == client_of(by_key.owner) == client.id
