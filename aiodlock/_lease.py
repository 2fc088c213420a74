"""What a holder gets (:class:`Lease`) and what anyone can see (:class:`LockStatus`)."""

from __future__ import annotations

import time
from typing import Protocol

from ._types import LockStatus

__all__ = ["Lease", "LockStatus"]


class Holding(Protocol):
    """What a :class:`Lease` reads of its holding: the client's ``Hold`` while it lasts,
    then a copy of its final state (``Ended``)."""

    @property
    def lost(self) -> bool: ...

    @property
    def released(self) -> bool: ...

    @property
    def lost_reason(self) -> str | None: ...

    @property
    def expires_at(self) -> float | None: ...

    async def wait_lost(self) -> None: ...


class Lease:
    """One holding of a lock by one owner (a task, or an ``owner=`` key, of a client); a
    reentrant acquire by the same owner returns the same ``Lease``."""

    __slots__ = ("_hold", "name", "owner", "token", "ttl")

    def __init__(self, hold: Holding, name: str, owner: str, token: int, ttl: float | None) -> None:
        #: The holding while it lasts; a copy of its final state once it is over.
        self._hold: Holding = hold
        self.name = name
        self.owner = owner
        self.token = token
        #: The fixed lease length, or ``None`` when a watchdog renews the lease.
        self.ttl = ttl

    @property
    def lost(self) -> bool:
        """True once the lease can no longer be guaranteed."""
        return self._hold.lost

    @property
    def released(self) -> bool:
        """True once the last release of this holding has happened."""
        return self._hold.released

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, or ``None``."""
        return self._hold.lost_reason

    @property
    def expires_in(self) -> float | None:
        """Seconds of guaranteed validity left (0.0 once lost or released; ``None`` when the
        lease is bound to a server session that has no fixed end)."""
        hold = self._hold
        if hold.lost or hold.released:
            return 0.0
        if hold.expires_at is None:
            return None
        return max(0.0, hold.expires_at - time.monotonic())

    async def wait_lost(self) -> None:
        """Return once the lease is lost (never returns for a lease that is kept)."""
        await self._hold.wait_lost()

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return f"<Lease {self.name!r} token={self.token} owner={self.owner!r} {state}>"
