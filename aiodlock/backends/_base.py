"""The contract between the core and a backend.

The core (``aiodlock._client`` / ``_lock`` / ``_watchdog``) owns every policy: owner identity,
reentrancy, deadlines, waiting, the watchdog, lost-lease handling and cancellation.  A backend
only speaks its protocol (see each method of :class:`Backend`), and keeps these invariants:

* ``owner`` strings are unique per (client, task) and are what :class:`LockStatus` reports;
* an attempt by an owner that already holds the name on the server is idempotent: it
  succeeds again with the SAME token and refreshes the lease (the core never sends a nested
  acquire, but a retried attempt whose first reply was lost must not count twice);
* times are on the :func:`time.monotonic` clock (the asyncio loop's clock) on the client
  side; expiries stored on a server use the server's clock;
* every driver call goes through the backend's one translation context manager so that
  only :class:`~aiodlock.BackendError` / :class:`~aiodlock.BackendTimeout` escape.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Awaitable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Self

from .._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LockStatus,
    LostCallback,
    Request,
    Waiter,
)
from .._url import ParsedURL

__all__ = ["Backend"]


class Backend(abc.ABC):
    """The protocol one lock service speaks.  Subclass it and register the scheme(s)."""

    #: Short name used in messages, e.g. ``"redis"``.
    backend_name: ClassVar[str]
    capabilities: ClassVar[Capability] = Capability.NONE

    config: CommonConfig

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        """Build from a parsed URL (no I/O); take your ``options`` with ``aiodlock._url``'s
        ``take_*`` helpers: the core refuses what is left."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The URL with any password masked (for ``repr`` and messages)."""

    @abc.abstractmethod
    async def open(self, on_lost: LostCallback) -> None:
        """Connect.  Session-bound backends call ``on_lost`` when leases die."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Disconnect and stop background tasks.  Idempotent."""

    @abc.abstractmethod
    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        """ONE atomic attempt: a :class:`Grant`, or :class:`Busy`.  Without ``will_wait`` (a
        try-lock) a denied attempt leaves nothing on the server; with it a fair backend may
        keep the owner's place in line (the core calls :meth:`abandon` if no grant follows)."""

    def waiter(self, request: Request) -> AbstractAsyncContextManager[Waiter]:
        """The wake-up source (pub/sub, a watch, a local event...) a waiter sleeps on between
        attempts; entered BEFORE the retry that precedes a wait.  The default polls with capped
        exponential backoff and jitter."""
        from .._wakeup import Backoff, BoardWaiter, Slot

        return contextlib.nullcontext(BoardWaiter(Slot(), Backoff()))

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        """Acquire by ``deadline`` (monotonic; ``None``: forever), else clean up and return
        None.  Not overridden (the rule), the core runs its own loop (``acquire_loop``) on
        :meth:`try_acquire` and :meth:`waiter` instead of calling this; a protocol whose
        server queues the waiters itself overrides it with the whole wait."""
        raise NotImplementedError(
            f"the {self.backend_name} backend waits through the core's loop (acquire_loop)"
        )

    @abc.abstractmethod
    async def renew(self, grants: Sequence[Grant], ttl: float) -> Sequence[float | None]:
        """Renew every grant (pipelined where possible): per grant the new ``expires_at``
        (measured from before the request was sent) or ``None`` when the lease is gone or
        someone else's; :class:`~aiodlock.BackendError` when the server could not be asked."""

    @abc.abstractmethod
    async def release(self, grant: Grant) -> bool:
        """Compare-and-delete by owner; wakes the next waiter.  False if it was not ours."""

    def start_release(self, grant: Grant) -> Awaitable[bool]:
        """:meth:`release`, begun now (sent without awaiting where the connection allows, so the
        core's bookkeeping overlaps it).  Must not raise; the result is always awaited."""
        return self.release(grant)

    async def transfer(self, grant: Grant, to: Request) -> Grant | bool:
        """Release ``grant`` and grant its name to ``to.owner`` in ONE step (only with
        :attr:`Capability.TRANSFER`; the core calls it for a waiting owner of the same client,
        never for a fair request).

        Returns the receiver's :class:`Grant` when handed over; True when released without a
        hand-over (the protocol gives the turn to someone else, as a plain release would);
        False when ``grant`` was no longer held (nothing changed).  Raises
        :class:`~aiodlock.BackendError` when it is unknown what happened.
        """
        raise NotImplementedError(f"the {self.backend_name} backend cannot transfer a lock")

    @abc.abstractmethod
    async def abandon(self, request: Request) -> None:
        """After an acquire that raised or was cancelled (called shielded, bounded): delete the
        lock if ``request.owner`` holds it, and drop its queue entry or node."""

    @abc.abstractmethod
    async def status(self, name: str) -> LockStatus | None:
        """Who holds ``name`` now (any process), or ``None``."""

    @abc.abstractmethod
    async def force_release(self, name: str) -> bool:
        """Break the lock whoever holds it; True if something was released."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"
