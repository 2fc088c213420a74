"""``Lock``: the handle users hold, only a name plus options.  One handle may be shared by
several tasks, each its own owner (unless ``owner=`` names one); two handles for the same name
used by one task are the same owner (reentrant)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._checks import check_name, check_seconds
from ._errors import BackendError, ConfigurationError, LockLost, LockTimeout
from ._hold import BodyEntry, Hold, OnLost, check_on_lost
from ._lease import Lease, holding
from ._types import LockStatus

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["Lock"]

_UNSET: Any = object()


class Lock:
    """A distributed lock.  Get one from :meth:`aiodlock.Client.lock`.

    ``async with lock as lease:`` waits up to the lock's ``timeout`` (``None``: forever),
    runs the body while the lease is held and releases at the end.  If the lease is lost
    while the body runs, the body is cancelled and :class:`~aiodlock.LockLost` is raised
    (``on_lost="cancel"``, the default).
    """

    __slots__ = ("_client", "_entries", "fair", "name", "on_lost", "owner", "timeout", "ttl")

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        fair: bool = False,
        on_lost: OnLost = "cancel",
        owner: str | None = None,
    ) -> None:
        self._client = client
        self._entries: dict[asyncio.Task[Any], list[tuple[Hold, BodyEntry]]] = {}
        self.name = check_name(name)
        self.ttl = check_seconds("ttl", ttl, allow_none=True, positive=True)
        self.timeout = check_seconds("timeout", timeout, allow_none=True, positive=False)
        if not isinstance(fair, bool):
            raise ConfigurationError(f"fair must be True or False, got {fair!r}")
        client.check_fair(fair)
        self.fair = fair
        self.on_lost = check_on_lost(on_lost)
        if owner is not None and not (isinstance(owner, str) and 0 < len(owner) <= 256):
            raise ConfigurationError(f"owner must be a str of 1-256 characters, got {owner!r:.80}")
        #: The owner key: the hold belongs to the client and this key instead of a task.
        self.owner = owner

    @property
    def client(self) -> Client:
        return self._client

    def __repr__(self) -> str:
        opts = []
        if self.ttl is not None:
            opts.append(f"ttl={self.ttl:g}")
        if self.fair:
            opts.append("fair")
        if self.owner is not None:
            opts.append(f"owner={self.owner!r}")
        return f"<aiodlock.Lock {self.name!r}{' ' if opts else ''}{' '.join(opts)}>"

    async def acquire(self, timeout: float | None = _UNSET) -> Lease:
        """Wait until acquired and return the lease; :class:`LockTimeout` after ``timeout``.

        ``timeout`` defaults to the lock's; ``None`` waits forever; ``0`` is one attempt.
        An owner that already holds the lock gets the same lease back (no round trip) and
        must release once more.
        """
        if timeout is _UNSET:
            timeout = self.timeout
        else:
            timeout = check_seconds("timeout", timeout, allow_none=True, positive=False)
        return await self._client.acquire(
            self.name,
            ttl=self.ttl,
            timeout=timeout,
            fair=self.fair,
            on_lost=self.on_lost,
            key=self.owner,
        )

    async def try_acquire(self) -> Lease | None:
        """One attempt that never waits for a holder: the lease, or ``None``."""
        try:
            return await self.acquire(timeout=0)
        except LockTimeout:
            return None

    async def release(self) -> None:
        """Release one acquire of this lock's owner (the current task, or ``owner=``).

        Raises :class:`~aiodlock.LockNotOwned` if the owner does not hold the lock, and
        :class:`~aiodlock.LockLost` (with ``on_lost="cancel"``) if the lease had been lost.
        """
        await self._client.release(self.name, self.owner)

    async def extend(self, ttl: float | None = None) -> None:
        """Renew the lease now (for ``ttl`` seconds if given, else its own length).

        Raises :class:`~aiodlock.LockLost` if the lease is gone.
        """
        ttl = check_seconds("ttl", ttl, allow_none=True, positive=True)
        await self._client.extend(self.name, ttl, self.owner)

    @property
    def held(self) -> bool:
        """Does the owner (the current task, or ``owner=``) hold it, not known to be lost?"""
        hold = self._client.current_hold(self.name, self.owner)
        return hold is not None and not hold.lost

    @property
    def lease(self) -> Lease | None:
        """The owner's lease on this lock, if it holds it."""
        hold = self._client.current_hold(self.name, self.owner)
        return None if hold is None else hold.lease

    async def status(self) -> LockStatus | None:
        """Who holds this lock now, in any process."""
        return await self._client.status(self.name)

    async def __aenter__(self) -> Lease:
        lease = await self.acquire()
        hold = holding(lease)
        assert isinstance(hold, Hold)  # (a fresh or reentrant holding is live)
        task = asyncio.current_task()
        assert task is not None
        entry = BodyEntry(task)
        hold.entries.append(entry)
        self._entries.setdefault(task, []).append((hold, entry))
        if hold.lost and hold.on_lost == "cancel":
            # Lost before the body even started (a nested level of a lost hold).
            entry.cancel_requested = True
            task.cancel(f"aiodlock: the lease of {self.name!r} was lost")
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        entries = self._entries[task]
        hold, entry = entries.pop()
        if not entries:
            del self._entries[task]
        hold.entries.remove(entry)
        absorbed = False
        rethrow: asyncio.CancelledError | None = None
        if entry.cancel_requested and not isinstance(exc, asyncio.CancelledError):
            # The lease was lost and this level cancelled the body, but the body ended
            # before the cancellation reached it: it is still pending and would hit the
            # release below as a bare CancelledError.  Take it here.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                absorbed = True
        ours = False
        # NOTE: as asyncio.timeout does: the cancellation this level requested is ours only
        # if no other cancellation is pending on the task.
        if entry.cancel_requested and task.uncancel() == 0:
            ours = isinstance(exc, asyncio.CancelledError)
        elif absorbed:
            # Somebody else cancelled the task too: release, then let that cancellation on.
            exc = rethrow = asyncio.CancelledError()
        foreign_cancel = isinstance(exc, asyncio.CancelledError) and not ours
        propagating = exc is not None and not ours
        if hold.released:  # released by hand inside the body
            if ours:
                raise LockLost(f"lock {self.name!r} was lost while held: {hold.lost_reason}")
            if rethrow is not None:
                raise rethrow
            return
        try:
            await self._client.release_hold(hold)
        except LockLost as lost:
            if rethrow is not None:
                raise rethrow from None  # the foreign cancellation, taken above
            if foreign_cancel or isinstance(exc, LockLost):
                return
            raise lost from (exc if propagating else None)
        except BackendError:
            if propagating:
                # The body's own exception matters more; the lease ends by itself.
                return
            raise
        if rethrow is not None:
            raise rethrow  # the foreign cancellation, taken above
        if ours:  # pragma: no cover - release raises LockLost for a lost hold
            raise LockLost(f"lock {self.name!r} was lost while held: {hold.lost_reason}")
