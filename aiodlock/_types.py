"""Layer 0 (imports nothing of the library): the values the core and the backends exchange,
and the clock.  New kinds of request are new fields of :class:`Request` with defaults."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Busy",
    "Capability",
    "CommonConfig",
    "Grant",
    "LockStatus",
    "LostCallback",
    "Request",
    "Waiter",
    "client_of",
    "monotonic",
]

monotonic = time.monotonic
"""The client-side clock (the asyncio event loop uses the same one)."""


def client_of(owner: str) -> str:
    """The id of the client that ``owner`` belongs to: a client's owners are ``f"{id}:{n}"``
    (a task) and ``f"{id}/{key}"`` (``owner=key``), and an id holds neither ``:`` nor ``/``."""
    return owner.split("/", 1)[0].split(":", 1)[0]


class Capability(enum.Flag):
    """What a backend can do; checked by the core before anything is sent."""

    NONE = 0
    #: ``fair=True`` is supported (FIFO in request order).
    FAIR = enum.auto()
    #: Every lock is FIFO-fair, whatever ``fair`` says.
    ALWAYS_FAIR = enum.auto()
    #: Fencing tokens strictly increase per name (see the backend's docs for exceptions).
    FENCING = enum.auto()
    #: Leases are bound to a server session / lease object the backend keeps alive itself:
    #: the core never calls :meth:`Backend.renew`; the backend reports losses through the
    #: :data:`LostCallback` it receives in :meth:`Backend.open`.
    SESSION_LEASE = enum.auto()
    #: Locks are visible to other processes (everything but ``memory://``).
    CROSS_PROCESS = enum.auto()
    #: :meth:`Backend.transfer` releases a grant and grants the name to another owner in
    #: one round trip (the core hands a lock to a waiting task of the same client).
    TRANSFER = enum.auto()
    #: An ``urgent`` request (see :class:`Request`) waits in a line on the server that every
    #: attempt respects; the core abandons one that ends without a grant, like a fair one.
    URGENT = enum.auto()
    #: Two owners of one client asking at once would only split the vote (a quorum): the
    #: core lets one of them ask at a time, answers locally while another of them holds the
    #: name, and a release by the client wakes its next waiter itself.
    LOCAL_TURNS = enum.auto()


@dataclasses.dataclass(frozen=True, slots=True)
class CommonConfig:
    """Options every backend shares (parsed by the core)."""

    namespace: str = "aiodlock"
    watchdog_ttl: float = 30.0
    connect_timeout: float = 5.0
    op_timeout: float = 5.0


@dataclasses.dataclass(slots=True)
class Request:
    """One owner's wish to take one name."""

    name: str
    owner: str
    #: Lease length in seconds (``watchdog_ttl`` for watchdog-renewed locks).
    ttl: float
    fair: bool = False
    #: A non-fair waiter that has waited past the core's starvation bound (set by the core,
    #: only for a backend with :attr:`Capability.URGENT`): it takes a place in the server's
    #: line, and nobody barges past the line until it is served (Go's starvation mode).
    urgent: bool = False
    #: When the owner began to wait, by the wall clock (:func:`time.time`), set by the core
    #: with ``urgent``: a line that spans servers ranks its waiters by it (Redlock's).
    waiting_since: float = 0.0
    #: Set by a backend once an attempt of this request took a place in the server's line
    #: (a fair or urgent one): the core abandons the request if it ends without a grant.
    queued: bool = False


@dataclasses.dataclass(slots=True)
class Grant:
    """A lease the server granted."""

    name: str
    owner: str
    token: int
    #: When the lease ends at the latest, on the client's :func:`monotonic` clock, measured
    #: from BEFORE the granting request was sent (so it is conservative); ``None`` when the
    #: lease is bound to a session that the backend keeps alive.
    expires_at: float | None
    #: Backend-private data (a node path, a lease id, a version...).
    data: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Busy:
    """The name is held by someone else."""

    #: Seconds until the holder's lease ends if nobody renews it, when the server said.
    retry_after: float | None = None
    #: ``retry_after`` is a pause that wake-ups do not cut short (after a split vote the
    #: contenders, woken by each other's clean-up, would collide again at once).
    pause: bool = False


class Waiter:
    """A wake-up source for one waiting owner (entered before the retry that precedes a wait)."""

    __slots__ = ()

    #: Since when (monotonic) a release is certain to wake it (its subscription confirmed), or
    #: None: from before the first attempt, the loop sleeps before asking again.
    listening_since: float | None = None

    async def wait(self, timeout: float | None) -> bool:
        """Return when woken (True: a release, a hand-off) or after ``timeout`` seconds."""
        raise NotImplementedError

    def listening(self) -> bool:
        """Would the server's announcement of a release reach this waiter right now?"""
        return False

    def wake(self) -> None:
        """Wake it now (a hand-off by this client delivered it a grant)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be woken by a hand-off")


#: Called by a session-bound backend when leases are lost: ``(grants, reason)``.
LostCallback = Callable[[Sequence[Grant], str], None]


@dataclasses.dataclass(frozen=True, slots=True)
class LockStatus:
    """Who holds a lock right now, as the backend sees it."""

    name: str
    owner: str  # (the holder's Lease.owner)
    token: int
    #: Seconds left on the holder's lease (None: bound to a session with no fixed end).
    expires_in: float | None
    #: How many wait in line, where the backend knows it.
    waiters: int | None = None
