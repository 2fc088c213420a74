"""Layer 2: a client's own waiters, and the hand-off of a lock between them (never to a fair
request: its order is the server's).  A release that a waiting task of the SAME client can
take is a **transfer** (:attr:`Capability.TRANSFER`: to the oldest waiter not busy with an
attempt of its own, in one round trip), else a **reservation** of the next attempt for the
waiter it wakes (:class:`~._wakeup.Reservations`); with **local turns**
(:attr:`Capability.LOCAL_TURNS`) the client's owners ask one at a time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ._errors import BackendError
from ._types import Busy, Capability, Grant, Request, Waiter, monotonic
from ._wakeup import Reservations

if TYPE_CHECKING:
    from .backends._base import Backend

__all__ = ["Entry", "LocalWaiters"]

log = logging.getLogger("aiodlock")


@dataclasses.dataclass(slots=True, eq=False)
class Entry:
    """One waiting owner of this client (non-fair), while it is inside the wait."""

    request: Request
    waiter: Waiter
    #: Set when the answer of a hand-off to this owner (under way) is in.
    transfer: asyncio.Event | None = None
    #: The grant a hand-off delivered, until the owner's next attempt takes it.
    delivered: Grant | None = None
    #: A hand-off to this owner failed half-way: the server may have granted it.
    uncertain: bool = False
    attempting: bool = False
    granted: bool = False
    #: No attempt before then (monotonic): the pause after a split vote.
    not_before: float = 0.0

    def needs_settling(self) -> bool:
        """Did a hand-off leave something that the leaving owner must give back?"""
        return (
            self.transfer is not None
            or self.delivered is not None
            or (self.uncertain and not self.granted)
        )


class LocalWaiters:
    """The non-fair waiters of one client, by name then owner (oldest first)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._names: dict[str, dict[str, Entry]] = {}
        op_timeout = backend.config.op_timeout
        self.reservations = Reservations(min(0.1, op_timeout))
        self.transfers = bool(backend.capabilities & Capability.TRANSFER)
        self.turns = bool(backend.capabilities & Capability.LOCAL_TURNS)
        #: (local turns) name -> (owner, until): held by that owner of this client
        self._holders: dict[str, tuple[str, float]] = {}
        #: (local turns) names asked for now -> the waiters turned away meanwhile
        self._asking: dict[str, list[Entry]] = {}
        self._patience = op_timeout * 2  # (a leaving waiter's wait for a hand-off's answer)

    def __bool__(self) -> bool:
        return bool(self._names)

    def waiting(self, name: str) -> int:
        """How many owners of this client wait for ``name``."""
        return len(self._names.get(name, ()))

    def join(self, request: Request, waiter: Waiter) -> Entry:
        entry = Entry(request, waiter)
        self._names.setdefault(request.name, {})[request.owner] = entry
        return entry

    def leave(self, entry: Entry) -> None:
        name = entry.request.name
        entries = self._names.get(name)
        if entries is not None and entries.get(entry.request.owner) is entry:
            del entries[entry.request.owner]
            if not entries:
                del self._names[name]

    def receiver(self, name: str, releaser: str) -> Entry | None:
        """The oldest waiter of ``name`` that may receive a hand-off (or a turn) now."""
        now = monotonic()
        for owner, entry in self._names.get(name, {}).items():
            if (
                owner != releaser
                and entry.transfer is None
                and entry.delivered is None
                and not entry.attempting
                and entry.not_before <= now
            ):
                return entry
        return None

    # -- releasing: hand over, or release and reserve ------------------------------------------

    def start_release(self, grant: Grant, fair: bool) -> Awaitable[bool]:
        """Release ``grant`` (begun now, see :meth:`Backend.start_release`), handing it to a
        waiting owner of this client where the backend can; True: released."""
        if self.turns:
            return self._turn_on(grant, self._backend.start_release(grant))
        if fair or not self._names:
            return self._backend.start_release(grant)
        if self.transfers:
            entry = self.receiver(grant.name, grant.owner)
            if entry is not None:
                return self._transfer(grant, entry)
        return self._released(grant.name, self._backend.start_release(grant))

    async def _released(self, name: str, pending: Awaitable[bool]) -> bool:
        """A plain release's answer; reserves the next attempt for a local waiter that the
        server's announcement reaches (a reservation for one never woken stalls the rest)."""
        released = await pending
        entries = self._names.get(name, {})
        if released and any(e.waiter.listening() for e in entries.values()):
            self.reservations.reserve(name)
        return released

    async def _turn_on(self, grant: Grant, pending: Awaitable[bool]) -> bool:
        """(local turns) Once the release is answered, wake the next local waiter and reserve
        the next attempt for the waiters: the releaser must not barge back in."""
        try:
            return await pending
        finally:
            name = grant.name
            holder = self._holders.get(name)
            if holder is not None and holder[0] == grant.owner:
                del self._holders[name]
            entries = self._names.get(name)
            receiver = self.receiver(name, grant.owner) if entries else None
            if receiver is not None:
                receiver.waiter.wake()
            if entries and (receiver or any(e.attempting for e in entries.values())):
                self.reservations.reserve(name)

    async def _transfer(self, grant: Grant, entry: Entry) -> bool:
        """Release ``grant`` handing the name to ``entry`` in one round trip."""
        done = entry.transfer = asyncio.Event()
        try:
            result = await self._backend.transfer(grant, entry.request)
        except BaseException as exc:
            # The step may or may not have happened: the waiter asks the server itself (an
            # attempt by an owner that holds the lock gets it again), and if it leaves
            # without a grant, settling compare-and-deletes by owner.
            entry.uncertain = True
            entry.transfer = None
            done.set()
            entry.waiter.wake()
            if isinstance(exc, BackendError):
                return await self._released(grant.name, self._backend.release(grant))
            raise
        entry.transfer = None
        done.set()
        if isinstance(result, Grant):
            entry.delivered = result
            entry.waiter.wake()
            return True
        # NOTE: released without a hand-over (the server's line goes first): no reservation,
        # which would only hold this client's waiters back meanwhile.
        return result

    # -- waiting ------------------------------------------------------------------------------

    def attempt(self, entry: Entry, woken: bool = False) -> Awaitable[Grant | Busy]:
        """One attempt of a waiting owner (``woken``: a wake-up ended its last sleep): a grant
        a hand-off delivered (no round trip), else as :meth:`first` (not a coroutine of its
        own when no hand-off concerns it: the contended path)."""
        if entry.transfer is None and entry.delivered is None:
            return self.first(entry.request, True, entry, woken)
        return self._handed(entry, woken)

    async def _handed(self, entry: Entry, woken: bool) -> Grant | Busy:
        if entry.transfer is not None:
            # A hand-off to this owner is under way: its answer decides (asking the server
            # meanwhile could take the same grant twice).
            await entry.transfer.wait()
        delivered = entry.delivered
        if delivered is not None:
            entry.delivered = None
            entry.granted = True
            return delivered
        # NOTE: no await from the check of entry.delivered to entry.attempting: a release
        # either handed over before (taken above) or sees that flag and picks another receiver.
        return await self.first(entry.request, True, entry, woken)

    async def first(
        self, request: Request, will_wait: bool, entry: Entry | None = None, woken: bool = False
    ) -> Grant | Busy:
        """An owner's attempt (``entry``: one of the waiters here): Busy while the next attempt
        is another local owner's (a reservation, a turn), else the server's answer."""
        name = request.name
        turns = self.turns
        if turns:
            holder = self._holders.get(name)
            if holder is not None and holder[0] != request.owner:
                left = holder[1] - monotonic()
                if left > 0:
                    return Busy(left)  # another owner of this client holds it: no round trip
        reservations = self.reservations
        reserved = False
        if reservations and will_wait and not (request.fair or request.urgent):
            # (a fair or urgent request goes in line on the server, which keeps the order)
            barred = reservations.bar(name, woken)
            if barred is not None:
                return Busy(barred)  # a release of this client woke another waiter
            reserved = woken and name in reservations
        if turns:
            turned_away = self._asking.get(name)
            if turned_away is not None and will_wait:
                # Two local owners cannot both win: they would only split the vote.  The
                # attempt on its way wakes this waiter if it fails (it may be the first in
                # the server's line, whom nobody else will wake).
                if entry is not None:
                    turned_away.append(entry)
                return Busy(None)
            self._asking[name] = []
        if entry is not None:
            entry.attempting = True
        result: Grant | Busy | None = None
        try:
            result = await self._backend.try_acquire(request, will_wait=will_wait)
        finally:
            if entry is not None:
                entry.attempting = False
                if isinstance(result, Grant):
                    entry.granted = True
            if reserved:
                reservations.end(name)
            if turns:
                self._asked(name, request.owner, result)
        return result

    def _asked(self, name: str, owner: str, result: Grant | Busy | None) -> None:
        """(local turns) An attempt on ``name`` is answered (``None``: it raised)."""
        turned_away = self._asking.pop(name, ())
        if isinstance(result, Grant):
            self._holders[name] = (owner, result.expires_at or float("inf"))
        else:
            for entry in turned_away:
                entry.waiter.wake()

    def clear(self) -> None:  # (the client closed)
        self._holders.clear()
        self._asking.clear()

    async def settle(self, entry: Entry) -> None:
        """A waiter leaves: give back what a hand-off left it (in its own task, shielded, so
        that it cannot ask again meanwhile)."""
        transfer = entry.transfer
        if transfer is not None:
            # (the releaser's round trip is bounded by op_timeout)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(transfer.wait(), self._patience)
        delivered, entry.delivered = entry.delivered, None
        try:
            if delivered is not None:
                # Never taken (the waiter left as it came): release it, which may hand it
                # on to another waiter of this client.
                await self.start_release(delivered, False)
            elif entry.uncertain and not entry.granted:
                # A hand-off failed half-way and may have granted: compare-and-delete.
                await self._backend.abandon(entry.request)
        except Exception:
            msg = "aiodlock: could not give back a lock handed to a leaving waiter of %r; the "
            msg += "server lets it expire with its lease"
            log.warning(msg, entry.request.name, exc_info=True)
