"""Layer 1: ``Slots``, at most n holders at a time (a connection pool's, a connection's).

What :class:`asyncio.Semaphore` does, with one thing it lacks: :meth:`Slots.take_now` takes
a free slot without a coroutine (a backend's hot path takes and gives back a slot around
every statement, and a coroutine and the semaphore's own per call are a measurable share of
a short statement's client time).  Waiters are served first come, first served; a free slot
is not taken past a waiter.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from types import TracebackType

__all__ = ["Slots"]


class Slots:
    """``size`` slots: :meth:`take_now` or ``await`` :meth:`take`, then :meth:`give` once (or
    ``async with slots:``).  A slot given back goes straight to the longest waiter; a waiter
    cancelled as a slot came to it passes the slot on."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_now(self) -> bool:
        """Take a slot if one is free and nobody waits for one (True), without waiting."""
        if self._free and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting in line for one if none is free."""
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # (it was handed a slot as it was cancelled: the next one's)
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)  # (still in line: cancelled before its turn)

    def give(self) -> None:
        """Give back a taken slot: to the longest waiter, else free."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.take()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.give()
