"""The workloads.  Each one gets open adapters and returns a JSON-able dict.

* :func:`single` (A): one task, one name, acquire+release cycles for a fixed duration.
* :func:`contention` (B): N tasks contend for one name; each checks that nobody else is
  inside; wait, owner-change handoff gap, barging share, per-worker counts.
* :func:`many_names` (C): N tasks, each on its own name, cycles for a fixed duration.
* :func:`wake_traffic`: N clients (one waiter each) queue on one name; server-side
  commands, PUBLISHes and bytes per release, from INFO deltas.

Times come from ``time.perf_counter()``.  A contention run stops cleanly: after the
window, workers finish the cycle they are in (a waiter still gets the lock and releases
it), so every wait that started inside the window is measured to its end, including the
waits of workers a barging lock starves.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .adapters import Adapter
from .server import log
from .stats import summary_ms, time_weighted_percentile

__all__ = ["contention", "many_names", "single", "wake_traffic", "warm_up"]

perf = time.perf_counter


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 4)


async def segment(
    cls: type[Adapter],
    url: str,
    body: Callable[[Adapter], Awaitable[dict[str, Any]]],
    warm_name: str,
    *,
    label: str,
    brief: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """Open a fresh ``cls`` adapter, warm it up on ``warm_name``, run ``body`` on it, close
    it; log ``label`` and ``brief(result)``.  A failure is a result ``{"error": ...}``."""
    adapter = cls(url)
    started = perf()
    try:
        await adapter.open()
        try:
            await warm_up(adapter, warm_name)
            result = await body(adapter)
        finally:
            await adapter.close()
    except Exception as exc:
        log(f"  {label} ERROR {exc!r}")
        return {"error": repr(exc)}
    log(f"  {label} {brief(result)} ({perf() - started:.1f} s)")
    return result


async def warm_up(adapter: Adapter, prefix: str, *, tasks: int = 1, cycles: int = 20) -> None:
    """Load scripts, open as many pooled connections as the workload's tasks will use,
    import what is imported lazily: ``tasks`` tasks cycle on names of their own."""

    async def one(index: int) -> None:
        lock = adapter.new_lock(f"{prefix}:{index}")
        for _ in range(cycles):
            await adapter.acquire(lock)
            await adapter.release(lock)

    await asyncio.gather(*(one(i) for i in range(tasks)))


# --------------------------------------------------------------------------------------------
# A: one task, one name
# --------------------------------------------------------------------------------------------


async def single(
    adapter: Adapter, name: str, *, seconds: float, keep_latencies: bool = False
) -> dict[str, Any]:
    """One task cycles acquire+release on ``name`` for ``seconds``.

    ``keep_latencies=True`` adds the raw cycle times (seconds) as ``_latencies``.
    """
    lock = adapter.new_lock(name)
    latencies: list[float] = []
    start = perf()
    end = start + seconds
    now = start
    while now < end:
        t0 = now
        await adapter.acquire(lock)
        await adapter.release(lock)
        now = perf()
        latencies.append(now - t0)
    elapsed = now - start
    return {
        "cycles": len(latencies),
        "seconds": round(elapsed, 4),
        "cycles_per_s": round(len(latencies) / elapsed, 1),
        "cycle": summary_ms(latencies),
        **({"_latencies": latencies} if keep_latencies else {}),
    }


# --------------------------------------------------------------------------------------------
# B: N tasks, one name
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Entry:
    worker: int
    requested: float
    entered: float
    left: float


@dataclasses.dataclass
class _Room:
    """The critical section every worker enters; counts overlaps.

    Entries are recorded in flat arrays (no object per acquisition): see the note on the
    garbage collector in :func:`contention`.
    """

    inside: int = 0
    violations: int = 0
    stop: bool = False
    workers: array.array[int] = dataclasses.field(default_factory=lambda: array.array("i"))
    times: array.array[float] = dataclasses.field(default_factory=lambda: array.array("d"))

    def record(self, worker: int, requested: float, entered: float, left: float) -> None:
        self.workers.append(worker)
        self.times.extend((requested, entered, left))

    def entries(self) -> list[_Entry]:
        t = self.times
        return [_Entry(w, t[3 * i], t[3 * i + 1], t[3 * i + 2]) for i, w in enumerate(self.workers)]


async def contention(
    adapter: Adapter,
    name: str,
    *,
    workers: int,
    seconds: float,
    hold: float = 0.0,
    think: float = 0.0,
    fair: bool = False,
    drain_timeout: float = 15.0,
    settle: float = 0.0,
) -> dict[str, Any]:
    """``workers`` tasks of one client contend for ``name`` for ``settle + seconds``.

    Inside, a worker checks that nobody else is inside, yields to the loop (``hold``
    seconds; 0 = one ``sleep(0)``), checks again, leaves and releases; then it asks again
    (after ``think`` seconds).  The statistics cover the ``seconds`` after ``settle``:
    acquisitions and handoffs entered in that window, and every wait that ended in it or
    after it (so a wait that began while settling counts whole if it ended later).  The
    longest wait that ended while settling is reported apart (``settle_wait_max_ms``).
    Mutual exclusion is checked over the whole run.
    """
    room = _Room()
    waiting: dict[int, float] = {}
    # NOTE: the runner's own heap (six libraries' modules, earlier results) is frozen for the
    # run: otherwise a full collection of it (20-65 ms on the 2-CPU machine) stalls every
    # waiter at once, and the stall shows up as lock waits of whichever adapter is running.
    gc.collect()
    gc.freeze()

    async def worker(index: int) -> None:
        lock = adapter.new_lock(name, fair=fair)
        while not room.stop:
            requested = perf()
            waiting[index] = requested
            granted_at = await adapter.acquire(lock)
            entered = perf() if granted_at is None else granted_at
            del waiting[index]
            if room.inside:
                room.violations += 1
            room.inside += 1
            await asyncio.sleep(hold)
            if room.inside != 1:
                room.violations += 1
            room.inside -= 1
            left = perf()
            await adapter.release(lock)
            room.record(index, requested, entered, left)
            if think:
                await asyncio.sleep(think)

    try:
        start = perf()
        begin = start + settle
        end = begin + seconds
        tasks = [asyncio.create_task(worker(i), name=f"bench-worker-{i}") for i in range(workers)]
        await asyncio.sleep(settle + seconds)
        room.stop = True
        stopped = perf()
        aborted = False
        _, pending = await asyncio.wait(tasks, timeout=drain_timeout)
        censored: list[float] = []
        if pending:
            # Something never drained (a lock nobody releases): free it, then give up.
            aborted = True
            now = perf()
            censored = [now - t for t in waiting.values() if t < end]
            await adapter.abort(name)
            _, pending = await asyncio.wait(pending, timeout=5.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        drained = perf() - stopped
    finally:
        gc.unfreeze()
    errors = [
        repr(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception()
    ]

    entries = sorted(room.entries(), key=lambda e: e.entered)
    # Mutual exclusion, second check: the intervals [entered, left] must not overlap.
    overlaps = sum(1 for a, b in itertools.pairwise(entries) if b.entered < a.left)
    in_window = [e for e in entries if begin <= e.entered < end]
    waits = [
        e.entered - e.requested for e in entries if e.requested < end and e.entered >= begin
    ] + censored
    settling = [e.entered - e.requested for e in entries if e.entered < begin]
    gaps: list[float] = []
    same_owner = 0
    for previous, current in itertools.pairwise(in_window):
        if current.worker == previous.worker:
            same_owner += 1
        else:
            gaps.append(current.entered - previous.left)
    handoffs = max(len(in_window) - 1, 0)
    counts = [0] * workers
    for e in in_window:
        counts[e.worker] += 1
    mean = statistics.fmean(counts) if counts else 0.0
    spread = max((abs(c - mean) / mean for c in counts), default=0.0) if mean else None
    return {
        "workers": workers,
        "fair": fair,
        "hold_ms": hold * 1000,
        "think_ms": think * 1000,
        "seconds": round(seconds, 3),
        "settle_seconds": settle,
        "settle_wait_max_ms": _ms(max(settling, default=None)),
        "acquisitions": len(in_window),
        "acquisitions_per_s": round(len(in_window) / seconds, 1),
        "wait": {
            **summary_ms(waits),
            "p99_time_weighted_ms": _ms(time_weighted_percentile(waits, 99)),
        },
        "owner_changes": len(gaps),
        "handoff_gap": summary_ms(gaps),
        "handoffs": handoffs,
        "same_owner_share": round(same_owner / handoffs, 4) if handoffs else None,
        "per_worker": counts,
        "per_worker_min": min(counts, default=0),
        "per_worker_max": max(counts, default=0),
        "max_deviation_from_mean": None if spread is None else round(spread, 4),
        "violations": room.violations,
        "overlapping_intervals": overlaps,
        "drain_seconds": round(drained, 3),
        "aborted": aborted,
        "censored_waits": len(censored),
        "errors": errors,
    }


# --------------------------------------------------------------------------------------------
# C: N tasks, N names
# --------------------------------------------------------------------------------------------


async def many_names(
    adapter: Adapter, prefix: str, *, tasks: int, seconds: float, keep_latencies: bool = False
) -> dict[str, Any]:
    """``tasks`` tasks, each cycling on its own name ``{prefix}:{i}``, for ``seconds``."""
    latencies: list[float] = []
    start = perf()
    end = start + seconds

    async def worker(index: int) -> int:
        lock = adapter.new_lock(f"{prefix}:{index}")
        cycles = 0
        # NOTE: the deadline is checked by time, not by a flag another task sets: with an
        # in-process backend (memory://) a cycle may never suspend (then the tasks run one
        # after the other).
        now = perf()
        while now < end:
            await adapter.acquire(lock)
            await adapter.release(lock)
            t1 = perf()
            latencies.append(t1 - now)
            now = t1
            cycles += 1
        return cycles

    running = [asyncio.create_task(worker(i)) for i in range(tasks)]
    cycles = await asyncio.gather(*running)
    elapsed = perf() - start
    total = sum(cycles)
    return {
        "tasks": tasks,
        "cycles": total,
        "seconds": round(elapsed, 4),
        "cycles_per_s": round(total / elapsed, 1),
        "cycle": summary_ms(latencies),
        **({"_latencies": latencies} if keep_latencies else {}),
        "per_task_min": min(cycles, default=0),
        "per_task_max": max(cycles, default=0),
    }


# --------------------------------------------------------------------------------------------
# release-to-wake traffic: N clients waiting on one name
# --------------------------------------------------------------------------------------------


#: Top-level calls that run a script (one round trip each, unless pipelined).
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
SUBSCRIBE_COMMANDS = (
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "psubscribe",
    "punsubscribe",
)


@dataclasses.dataclass
class _Snapshot:
    calls: dict[str, int]
    stats: dict[str, int]
    reply_bytes: int


async def _snapshot(monitor: Any) -> _Snapshot:
    raw: bytes = await monitor.execute_command("INFO", "everything")
    calls: dict[str, int] = {}
    stats: dict[str, int] = {}
    for line in raw.decode().splitlines():
        if line.startswith("cmdstat_"):
            command, _, fields = line[len("cmdstat_") :].partition(":")
            for field in fields.split(","):
                key, _, value = field.partition("=")
                if key == "calls":
                    calls[command] = int(value)
        elif ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            if value.isdigit():
                stats[key] = int(value)
    # the bulk reply: $<len>\r\n<payload>\r\n
    return _Snapshot(calls, stats, len(raw) + len(str(len(raw))) + 5)


async def _subscribed_clients(monitor: Any) -> int:
    """Connections subscribed to at least one channel or pattern (CLIENT LIST)."""
    raw = await monitor.execute_command("CLIENT", "LIST")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    count = 0
    for line in text.splitlines():
        fields = dict(f.partition("=")[::2] for f in line.split())
        if any(int(fields.get(k, "0") or 0) for k in ("sub", "psub", "ssub")):
            count += 1
    return count


async def wake_traffic(
    make_adapter: Callable[[], Adapter],
    name: str,
    *,
    monitor_url: str,
    waiters: int,
    releases: int,
    hold: float,
    fair: bool,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """``waiters`` clients (each its own connections, like separate processes) take turns.

    After a warm-up (everyone has held the lock once, so every client is subscribed /
    queued), INFO is read, ``releases`` releases happen, INFO is read again.  The deltas
    per release: every command the server executed (including the commands inside
    scripts, as commandstats counts them), the script calls (EVALSHA...: the attempts),
    the (un)subscribe calls, the PUBLISHes, and the bytes in and out.
    """
    import redis.asyncio as aioredis

    monitor = aioredis.Redis.from_url(monitor_url)
    monitor.set_response_callback("INFO", lambda response, **options: response)
    adapters = [make_adapter() for _ in range(waiters)]
    released = 0
    stop = False
    started: set[int] = set()
    holders: list[int] = []
    room = _Room()

    async def worker(index: int, adapter: Adapter) -> None:
        nonlocal released
        lock = adapter.new_lock(name, fair=fair)
        while not stop:
            started.add(index)
            await adapter.acquire(lock)
            if room.inside:
                room.violations += 1
            room.inside += 1
            await asyncio.sleep(hold)
            room.inside -= 1
            await adapter.release(lock)
            released += 1
            holders.append(index)

    async def until(predicate: Callable[[], bool], limit: float) -> bool:
        deadline = perf() + limit
        while not predicate():
            if perf() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    try:
        for adapter in adapters:
            await adapter.open()
        tasks = [asyncio.create_task(worker(i, a)) for i, a in enumerate(adapters)]
        # Every client is waiting (it has asked at least once) and the lock changed hands a
        # few times since, so every subscription / queue entry is in place.  A barging lock
        # may never let some clients in: that is measured (``distinct_holders``), not awaited.
        await until(lambda: len(started) == waiters, timeout)
        mark = released
        await until(lambda: released - mark >= 2 * waiters, min(timeout, 3.0))
        subscribers = await _subscribed_clients(monitor)
        before = await _snapshot(monitor)
        r0 = released
        h0 = len(holders)
        t0 = perf()
        completed = await until(lambda: released - r0 >= releases, timeout)
        after = await _snapshot(monitor)
        r1 = released
        elapsed = perf() - t0
        window_holders = set(holders[h0:])
        stop = True
        _, pending = await asyncio.wait(tasks, timeout=15.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for adapter in adapters:
            try:
                await adapter.close()
            except Exception:  # a close failing must not hide the measurement's error
                pass
        await monitor.aclose()

    n = max(r1 - r0, 1)
    commands = {
        command: after.calls.get(command, 0) - before.calls.get(command, 0)
        for command in set(after.calls) | set(before.calls)
        if command != "info"
    }
    commands = {c: d for c, d in sorted(commands.items()) if d}

    def delta(key: str) -> int:
        return after.stats.get(key, 0) - before.stats.get(key, 0)

    publishes = commands.get("publish", 0) + commands.get("spublish", 0)
    scripts = sum(commands.get(c, 0) for c in SCRIPT_COMMANDS)
    subscriptions = sum(commands.get(c, 0) for c in SUBSCRIBE_COMMANDS)
    out_bytes = delta("total_net_output_bytes") - before.reply_bytes
    return {
        "waiters": waiters,
        "fair": fair,
        "hold_ms": hold * 1000,
        "completed": completed,
        "releases": r1 - r0,
        "distinct_holders": len(window_holders),
        "subscribed_clients": subscribers,
        "seconds": round(elapsed, 3),
        "commands_per_release": round(sum(commands.values()) / n, 3),
        "scripts_per_release": round(scripts / n, 3),
        "subscribe_calls_per_release": round(subscriptions / n, 3),
        "publish_per_release": round(publishes / n, 3),
        "out_bytes_per_release": round(out_bytes / n, 1),
        "in_bytes_per_release": round(delta("total_net_input_bytes") / n, 1),
        "commands": commands,
        "pubsub_channels_after": after.stats.get("pubsub_channels"),
        "violations": room.violations,
    }
