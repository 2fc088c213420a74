"""``Lock``: the handle users hold, only a name plus options (the holdings are the client's)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, Protocol

from ._checks import check_name, check_seconds
from ._errors import BackendError, ConfigurationError, LockLost, LockTimeout, Unsupported
from ._hold import BodyEntry, Hold, OnLost
from ._lease import Lease
from ._types import Capability, LockStatus
from .backends._base import Backend

__all__ = ["Lock", "Locking"]


class Locking(Protocol):
    """What a :class:`Lock` asks of the client it came from (:class:`~aiodlock.Client`,
    which keeps the holdings)."""

    @property
    def backend(self) -> Backend: ...

    async def acquire(
        self, lock: Lock, timeout: float | None, task: asyncio.Task[Any] | None
    ) -> Hold: ...

    def release(self, name: str, key: str | None = None) -> Awaitable[None]: ...

    async def release_hold(self, hold: Hold) -> None: ...

    async def extend(self, name: str, ttl: float | None, key: str | None = None) -> None: ...

    def current_hold(self, name: str, key: str | None = None) -> Hold | None: ...

    async def status(self, name: str) -> LockStatus | None: ...


_UNSET: Any = object()


class Lock:
    """A distributed lock, from :meth:`aiodlock.Client.lock`.  ``async with lock as lease:``
    waits up to the lock's ``timeout`` (``None``: forever), runs the body while the lease is
    held and releases at the end; if the lease is lost meanwhile, the body is cancelled and
    :class:`~aiodlock.LockLost` is raised (``on_lost="cancel"``, the default)."""

    __slots__ = ("_client", "_entries", "fair", "name", "on_lost", "owner", "timeout", "ttl")

    def __init__(
        self,
        client: Locking,
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
        # (the defaults, None, need no check: a handle per ``async with`` is the common use)
        if ttl is not None:
            ttl = check_seconds("ttl", ttl, allow_none=True, positive=True)
        if timeout is not None:
            timeout = check_seconds("timeout", timeout, allow_none=True, positive=False)
        self.ttl, self.timeout = ttl, timeout
        if fair is not False:
            if not isinstance(fair, bool):
                raise ConfigurationError(f"fair must be True or False, got {fair!r}")
            backend = client.backend
            if not backend.capabilities & (Capability.FAIR | Capability.ALWAYS_FAIR):
                raise Unsupported(
                    f"the {backend.backend_name} backend cannot grant locks in request order "
                    f"(fair=True)"
                )
        self.fair = fair
        if on_lost != "cancel" and on_lost != "ignore" and not callable(on_lost):
            raise ConfigurationError(
                f"on_lost must be 'cancel', 'ignore' or a callable, got {on_lost!r}"
            )
        self.on_lost = on_lost
        if owner is not None and not (isinstance(owner, str) and 0 < len(owner) <= 256):
            raise ConfigurationError(f"owner must be a str of 1-256 characters, got {owner!r:.80}")
        self.owner = owner  # (the hold belongs to the client and this key, not to a task)

    def __repr__(self) -> str:
        opts = [f" ttl={self.ttl:g}" if self.ttl is not None else "", " fair" if self.fair else ""]
        opts.append("" if self.owner is None else f" owner={self.owner!r}")
        return f"<aiodlock.Lock {self.name!r}{''.join(opts)}>"

    async def acquire(self, timeout: float | None = _UNSET) -> Lease:
        """Wait until acquired and return the lease; :class:`LockTimeout` after ``timeout``
        (default: the lock's; ``None``: forever; ``0``: one attempt).  An owner that holds
        the lock already gets the same lease back at once, and must release once more."""
        if timeout is _UNSET:
            timeout = self.timeout
        else:
            timeout = check_seconds("timeout", timeout, allow_none=True, positive=False)
        return (await self._client.acquire(self, timeout, asyncio.current_task())).lease

    async def try_acquire(self) -> Lease | None:
        """One attempt that never waits for a holder: the lease, or ``None``."""
        try:
            return await self.acquire(timeout=0)
        except LockTimeout:
            return None

    async def release(self) -> None:
        """Release one acquire of this lock's owner (the current task, or ``owner=``);
        :class:`LockNotOwned` if it does not hold it, :class:`LockLost` if the lease was lost
        (with ``on_lost="cancel"``)."""
        await self._client.release(self.name, self.owner)

    async def extend(self, ttl: float | None = None) -> None:
        """Renew the lease now (for ``ttl`` s, else its own length); LockLost if it is gone."""
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
        task = asyncio.current_task()
        hold = await self._client.acquire(self, self.timeout, task)
        assert task is not None
        entry = BodyEntry(task)
        hold.entries.append(entry)
        self._entries.setdefault(task, []).append((hold, entry))
        if hold.lost and hold.on_lost == "cancel":
            # Lost before the body even started (a nested level of a lost hold).
            entry.cancel_requested = True
            task.cancel(f"aiodlock: the lease of {self.name!r} was lost")
        return hold.lease

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
        ours = False
        rethrow: asyncio.CancelledError | None = None
        if entry.cancel_requested:
            cancelled = isinstance(exc, asyncio.CancelledError)
            if not cancelled:
                # The lease was lost and this level cancelled the body, but the body ended
                # before the cancellation reached it: it is still pending and would hit the
                # release below as a bare CancelledError.  Take it here.
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    # (if somebody else cancelled the task too: release, then let it go on)
                    rethrow = asyncio.CancelledError()
            # NOTE: as in asyncio.timeout: ours only if no other cancellation is pending.
            if task.uncancel() == 0:
                ours, rethrow = cancelled, None
        try:
            if not hold.released:  # (else it was released by hand inside the body)
                await self._client.release_hold(hold)
        except LockLost as lost:
            if rethrow is not None:
                raise rethrow from None
            if not ours and isinstance(exc, (asyncio.CancelledError, LockLost)):
                return
            raise lost from (None if ours else exc)
        except BackendError:
            if exc is not None and not ours:
                return  # the body's own exception matters more; the lease ends by itself
            raise
        if rethrow is not None:
            raise rethrow
        if ours:  # (released by hand, or an outer acquire still holds it)
            raise LockLost(f"lock {self.name!r} was lost while held: {hold.lost_reason}")
