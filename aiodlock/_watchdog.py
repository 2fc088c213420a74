"""One watchdog per client: renews every watchdog-mode lease and notices lost ones.

Two heaps instead of a task per lock: renewals (every ``watchdog_ttl / 3``; those due within
a tenth of that join one batch, pipelined) and expiries (a lease that ends while held is lost).
A batch runs in its own task, so a slow server never delays expiry detection.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from ._errors import LockError
from ._types import Capability, monotonic

if TYPE_CHECKING:
    from ._hold import Hold
    from .backends._base import Backend

__all__ = ["Watchdog"]

log = logging.getLogger("aiodlock")


class Watchdog:
    def __init__(
        self,
        backend: Backend,
        label: str,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        mark_lost: Callable[[Hold, str], None],
        holding: Callable[[], int],
    ) -> None:
        self._backend = backend
        self._config = backend.config
        self.interval = self._config.watchdog_ttl / 3  # (between two renewals of a lease)
        self._label = label
        self._spawn = spawn
        self._mark_lost = mark_lost
        self._holding = holding  # (how many holds the client has)
        self._renewals: list[tuple[float, int, int, Hold]] = []
        self._expiries: list[tuple[float, int, int, Hold]] = []
        self._seq = itertools.count()
        self._poke = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session_bound = bool(backend.capabilities & Capability.SESSION_LEASE)
        self._wake_at = math.inf  # when the loop wakes by itself (an earlier event pokes it)
        #: New holds due no earlier than ``_wake_at`` (with their generation), scheduled when
        #: the loop wakes if still held: most are released before and never reach the heaps.
        self._pending: list[tuple[Hold, int]] = []
        self._pending_limit = 64

    def start(self) -> None:
        if self._task is None:
            self._poke = asyncio.Event()
            self._wake_at = math.inf
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"aiodlock:watchdog:{self._label}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pending in (self._renewals, self._expiries, self._pending):
            pending.clear()

    def _renews(self, hold: Hold) -> bool:
        return not hold.fixed_ttl and not self._session_bound

    def track(self, hold: Hold) -> None:
        first = math.inf
        if not hold.fixed_ttl and not self._session_bound:  # (see _renews)
            first = hold.renew_at = hold.acquired_at + self.interval
        if hold.expires_at is not None and hold.expires_at < first:
            first = hold.expires_at
        if first == math.inf:
            return  # (a session's lease: nothing to renew, no end of its own)
        if first < self._wake_at:
            self._schedule(hold)  # (and wake the loop earlier)
            return
        # NOTE: the loop wakes by _wake_at at the latest, so it sees this hold in time.
        pending = self._pending
        pending.append((hold, hold.generation))
        if len(pending) > self._pending_limit:
            # Drop the released ones: kept alive, they trigger the garbage collector's passes.
            pending[:] = [(h, g) for h, g in pending if g == h.generation and h.active]
            self._pending_limit = max(64, 2 * len(pending))

    def untrack(self, hold: Hold) -> None:
        # Heap entries of an older generation are skipped when popped.
        hold.generation += 1

    def renewed(self, hold: Hold, expires_at: float | None) -> None:
        """A renewal (by the watchdog or ``extend()``) succeeded at ``expires_at``."""
        hold.expires_at = expires_at
        hold.last_error = None
        if self._renews(hold):
            hold.renew_at = monotonic() + self.interval
        hold.generation += 1
        self._schedule(hold)

    def _schedule(self, hold: Hold) -> None:
        gen = hold.generation
        earliest = math.inf
        if hold.renew_at is not None and not hold.renewing:  # (set only for a renewed lease)
            heapq.heappush(self._renewals, (hold.renew_at, next(self._seq), gen, hold))
            earliest = hold.renew_at
        if hold.expires_at is not None:
            heapq.heappush(self._expiries, (hold.expires_at, next(self._seq), gen, hold))
            earliest = min(earliest, hold.expires_at)
        # NOTE: only an event before _wake_at wakes the loop (the hot path costs no switch).
        if earliest < self._wake_at:
            self._wake_at = earliest
            self._poke.set()
        if len(self._renewals) > 1024 or len(self._expiries) > 1024:
            self._compact()

    def _compact(self) -> None:
        # Released holds leave stale entries until due: drop them when they dominate.
        for heap in (self._renewals, self._expiries):
            if len(heap) > 1024 and len(heap) > 4 * self._holding():
                heap[:] = [e for e in heap if e[2] == e[3].generation and e[3].active]
                heapq.heapify(heap)

    async def _run(self) -> None:
        while True:
            pending, self._pending = self._pending, []
            for hold, gen in pending:
                if gen == hold.generation and hold.active:
                    self._schedule(hold)
            now = monotonic()
            self._expire(now)
            batch = self._due_renewals(now)
            if batch:
                self._spawn(self._renew(batch), "renew")
            heads = [heap[0][0] for heap in (self._renewals, self._expiries) if heap]
            self._wake_at = wake = min(heads, default=math.inf)
            self._poke.clear()
            timeout = None if wake == math.inf else max(0.0, wake - monotonic())
            # NOTE: asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for swallows
            # a cancel() that arrives once the poke is already set, and stop() then hangs.
            try:
                async with asyncio.timeout(timeout):
                    await self._poke.wait()
            except TimeoutError:
                pass

    def _expire(self, now: float) -> None:
        heap = self._expiries
        while heap and heap[0][0] <= now:
            _, _, gen, hold = heapq.heappop(heap)
            stale = gen != hold.generation or not hold.active or hold.server_released
            if stale or hold.expires_at is None or hold.expires_at > now:
                continue
            if hold.fixed_ttl:
                reason = f"its fixed ttl of {hold.ttl:g} s ran out while it was held"
            else:
                reason = "its lease expired before it could be renewed"
                if hold.last_error:
                    reason += f" (last error: {hold.last_error})"
            self._mark_lost(hold, reason)

    def _due_renewals(self, now: float) -> list[Hold]:
        heap = self._renewals
        if not heap or heap[0][0] > now:
            return []
        # Everything due within a tenth of the interval joins this batch.
        horizon = now + self.interval / 10
        batch: list[Hold] = []
        while heap and heap[0][0] <= horizon:
            _, _, gen, hold = heapq.heappop(heap)
            if gen != hold.generation or not hold.active or hold.renewing:
                continue
            hold.renewing = True
            batch.append(hold)
        return batch

    async def _renew(self, batch: list[Hold]) -> None:
        gens = [hold.generation for hold in batch]
        results: Any = None
        error: BaseException | None = None
        try:
            # Bounded: a renewal past the earliest expiry in the batch is of no use.
            with anyio.fail_after(self._config.op_timeout):
                grants = [hold.grant for hold in batch]
                results = await self._backend.renew(grants, self._config.watchdog_ttl)
        except (LockError, TimeoutError, OSError) as exc:
            error = exc
        finally:
            for hold in batch:
                hold.renewing = False
            self._poke.set()
        for i, hold in enumerate(batch):
            if hold.generation != gens[i] or not hold.active:
                continue
            if error is not None:
                hold.last_error = str(error) or type(error).__name__
                log.warning("aiodlock: renewing %r failed: %s", hold.name, hold.last_error)
                hold.renew_at = monotonic() + min(self.interval / 4, 1.0)
                hold.generation += 1
                self._schedule(hold)
            elif results[i] is None:
                self._mark_lost(hold, "the lease was gone or owned by someone else at renewal")
            else:
                self.renewed(hold, results[i])
