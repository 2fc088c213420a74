"""Layer 2: the shared try-then-wait loop on a backend's ``try_acquire`` and ``waiter`` (entered
BEFORE the retry that precedes each sleep: a release in between is never missed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from ._errors import BackendError
from ._retry import Pauses
from ._shield import finish
from ._types import Busy, Capability, Grant, Request, Waiter, monotonic

if TYPE_CHECKING:
    from ._local import Entry, LocalWaiters
    from .backends._base import Backend

log = logging.getLogger("aiodlock")

#: How long a non-fair waiter waits before its attempts are urgent (a backend with
#: Capability.URGENT then lets nobody barge past it): long enough that the same-process
#: hand-off keeps its speed, short enough that no process waits much longer than its turn.
URGENT_AFTER = 0.01

__all__ = ["acquire_loop"]


async def acquire_loop(
    backend: Backend,
    request: Request,
    deadline: float | None,
    first: Busy,
    first_sent: float,
    local: LocalWaiters | None = None,
) -> Grant | None:
    """After a ``first`` attempt sent at ``first_sent`` (monotonic) was busy, sleep on the
    backend's waiter and try again until granted or ``deadline``.  A non-fair waiter joins
    the client's ``local`` waiters while it waits, so that a release by another task of the
    client can hand the lock to it."""
    if deadline is not None and monotonic() >= deadline:
        if request.fair or request.queued:
            await backend.abandon(request)
        return None
    urgent_at = first_sent + URGENT_AFTER
    if request.fair or not backend.capabilities & Capability.URGENT:
        urgent_at = math.inf
    granted: Grant | None = None
    try:
        context = backend.waiter(request)
        waiter = await _enter_waiter(context, deadline)
        if waiter is None:
            return None  # the deadline passed while the waiter was being set up
        # NOTE: what ``async with context`` does, spelled out: no coroutine or exit stack
        # of its own per wait (this is every contended acquisition's path).
        entry = None if local is None or request.fair else local.join(request, waiter)
        try:
            busy = _still_busy(waiter, first, first_sent)
            outage: Pauses | None = None
            woken = False
            while True:
                if busy is None:
                    now = monotonic()
                    if now >= urgent_at:
                        request.urgent = True
                        request.waiting_since = time.time() - (now - first_sent)
                        urgent_at = math.inf
                    # NOTE: the waiter is live here, so a release after this attempt wakes us.
                    try:
                        if entry is None:
                            result = await backend.try_acquire(request, will_wait=True)
                        else:
                            assert local is not None
                            result = await local.attempt(entry, woken)
                    except BackendError as exc:
                        if not exc.transient:
                            raise
                        # NOTE: a waiter outlives a failover (an attempt is idempotent, and the
                        # caller abandons what is left) until its deadline or until the failures
                        # last as long as the lease it asks for (every held one is lost then).
                        if outage is None:
                            outage = Pauses(request.ttl)
                        pause = outage.pause(exc, deadline)
                        msg = "aiodlock: waiting for %r: %s; trying again in %.3f s"
                        log.debug(msg, request.name, exc, pause)
                        await waiter.wait(pause)
                        woken = False
                        continue
                    outage = None
                    if isinstance(result, Grant):
                        granted = result
                        break
                    busy = result
                now = monotonic()
                remaining = math.inf if deadline is None else deadline - now
                if remaining <= 0:
                    break
                if busy.pause and busy.retry_after is not None:
                    # A split vote: wake-ups do not cut the pause short (see Busy.pause).
                    if entry is not None:
                        entry.not_before = now + busy.retry_after
                    await asyncio.sleep(min(busy.retry_after, remaining))
                    woken = await waiter.wait(0)
                else:
                    # (an owner about to turn urgent wakes then: nobody may announce a
                    # release to it while the lock passes between another process's tasks)
                    woken = await waiter.wait(_sleep_for(busy, min(remaining, urgent_at - now)))
                busy = None
        except BaseException as exc:
            if entry is not None:
                await _leave(local, entry)
            await context.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if entry is not None:
            await _leave(local, entry)
        await context.__aexit__(None, None, None)
        return granted
    finally:
        if not granted and (request.fair or request.queued):
            # A fair or urgent request keeps a place in line between attempts: drop it (to
            # its end, as this may run because the task was cancelled: see _shield).
            await finish(_drop_place(backend, request))


async def _drop_place(backend: Backend, request: Request) -> None:
    with contextlib.suppress(Exception):
        await backend.abandon(request)


async def _leave(local: LocalWaiters | None, entry: Entry) -> None:
    assert local is not None
    local.leave(entry)
    if entry.needs_settling():
        await finish(local.settle(entry))


async def _enter_waiter(
    context: AbstractAsyncContextManager[Waiter], deadline: float | None
) -> Waiter | None:
    """Enter the waiter ``context`` (a subscription, a watch: round trips), at most until
    ``deadline`` (None: it passed first), so that it does not stretch ``timeout=X``."""
    if deadline is None:
        return await context.__aenter__()  # (no timeout object on the hot path)
    loop = asyncio.get_running_loop()
    bound = asyncio.timeout_at(loop.time() + max(0.0, deadline - monotonic()))
    try:
        async with bound:
            return await context.__aenter__()
    except TimeoutError:
        if bound.expired():
            return None
        raise  # a timeout of the backend's own (BackendTimeout)


def _still_busy(waiter: Waiter, first: Busy, sent: float) -> Busy | None:
    """``first`` (what remains of it) when it needs no second ask, else None: a waiter
    listening since before the first attempt was sent has been woken by any release since
    (that wake-up ends the first sleep at once), unless the holder's lease ran out since."""
    since: float | None = getattr(waiter, "listening_since", None)
    if since is None or since > sent:
        return None
    if first.retry_after is None:
        return first
    left = first.retry_after - (monotonic() - sent)
    return Busy(left, first.pause) if left > 0 else None


def _sleep_for(result: Busy, remaining: float) -> float | None:
    limit = remaining
    if result.retry_after is not None:
        # Wake when the holder's lease would run out, even if no release message comes.
        limit = min(limit, max(result.retry_after, 0.0) + 0.001)
    return None if math.isinf(limit) else limit
