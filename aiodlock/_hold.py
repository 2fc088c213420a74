"""Layer 2: one owner's holding of one name in a client, and what a lease reads after it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from ._lease import Lease
from ._types import Grant, monotonic

__all__ = ["BodyEntry", "Ended", "Hold", "OnLost"]

#: What to do when a lease is lost: cancel the body, only set the flag, or call this.
OnLost = Literal["cancel", "ignore"] | Callable[[Lease], object]


@dataclasses.dataclass(slots=True, eq=False, weakref_slot=True)
class Hold:
    """One owner's holding of one name (shared by reentrant acquires; the client's table, the
    watchdog and the :class:`~aiodlock.Lease` refer to it)."""

    grant: Grant
    ttl: float
    fixed_ttl: bool
    on_lost: OnLost
    fair: bool = False  # taken in request order (so never handed over locally)
    name: str = dataclasses.field(init=False)
    owner: str = dataclasses.field(init=False)
    expires_at: float | None = dataclasses.field(init=False)
    lease: Lease = dataclasses.field(init=False)
    acquired_at: float = dataclasses.field(init=False, default_factory=monotonic)
    count: int = 1
    renew_at: float | None = None
    renewing: bool = False
    generation: int = 0
    released: bool = False
    server_released: bool = False
    lost: bool = False
    lost_event: asyncio.Event | None = None  # made when somebody waits for a loss
    lost_reason: str | None = None
    last_error: str | None = None
    #: One per ``async with`` level (outermost first); see Lock.__aenter__.
    entries: list[BodyEntry] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        grant = self.grant
        self.name, self.owner, self.expires_at = grant.name, grant.owner, grant.expires_at
        ttl = self.ttl if self.fixed_ttl else None
        self.lease = Lease(self, grant.name, grant.owner, grant.token, ttl)

    def end(self) -> None:
        """The holding is over: its lease reads a copy of the final state (:class:`Ended`)."""
        self.lease._hold = Ended(self.lost, self.lost_reason, self.expires_at)

    @property
    def active(self) -> bool:
        return not self.released and not self.lost

    async def wait_lost(self) -> None:
        if self.lost:
            return
        if self.lost_event is None:
            self.lost_event = asyncio.Event()
        await self.lost_event.wait()


@dataclasses.dataclass(slots=True)
class Ended:
    """What a :class:`Lease` reads once its holding is over; it breaks the hold <-> lease cycle
    (freed by reference counting: the cyclic collector's full passes stall the loop)."""

    lost: bool
    lost_reason: str | None
    expires_at: float | None
    released: ClassVar[bool] = True

    async def wait_lost(self) -> None:
        if self.lost:
            return
        await asyncio.get_running_loop().create_future()  # a kept lease is never lost


@dataclasses.dataclass(slots=True, eq=False)
class BodyEntry:
    """One ``async with`` level around a body: the task to cancel when the lease is lost."""

    task: asyncio.Task[Any]
    cancel_requested: bool = False
