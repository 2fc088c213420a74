"""Redis: waiting, and the same-process hand-off between the waiters of one backend.

:class:`HubWaiter` is woken through the backend's :class:`~._pubsub.PubSubHub`;
:class:`LocalWaiting` keeps the waiters of one backend, hands a released lock to one of them
in one round trip and reserves the next attempt for a woken waiter; :class:`Waiting` is one
owner waiting for one name.  (Redlock's counterpart: :mod:`._redlock_waiting`.)

All of it is local policy, kept apart from the protocol so that it can move into the core
as one piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from ..._errors import BackendError
from ..._wakeup import Backoff, BoardWaiter, Reservations, Slot, WakeupBoard
from .._base import Busy, Grant, Request, monotonic
from ._node import GrantData, ms
from ._pubsub import Channel, PubSubHub
from ._scripts import LockKeys

if TYPE_CHECKING:
    from ._node import RedisNode

log = logging.getLogger("aiodlock")


class HubWaiter:
    """A waiter woken through a :class:`PubSubHub` (its slot on the hub's board).

    ``listening()`` tells whether a release would reach this waiter by message now (its
    channel is confirmed); while it does not, the waiter also polls with capped backoff.
    """

    __slots__ = (
        "_asleep",
        "_backoff",
        "_listening",
        "_polling",
        "_slot",
        "attempting",
        "closing",
        "delivered",
        "granted",
        "listening_since",
        "owner",
        "transfer",
        "ttl",
        "uncertain",
        "woken",
    )

    def __init__(
        self, slot: Slot, listening: Callable[[], bool], *, owner: str = "", ttl: float = 0.0
    ) -> None:
        self._slot = slot
        self._listening = listening
        self._backoff = Backoff()
        # The core's board waiters: one that also polls (while not listening), one that
        # only sleeps (both consume a wake-up by giving the slot a new Wakeup).
        self._polling = BoardWaiter(slot, self._backoff)
        self._asleep = BoardWaiter(slot, None)
        # Same-process hand-off (see RedisBackend.release): the waiting owner and its lease.
        self.owner = owner
        self.ttl = ttl
        #: A release by this process is handing the lock to this waiter right now (set when
        #: the answer is in).
        self.transfer: asyncio.Event | None = None
        #: The grant a hand-off delivered, until the waiter's next attempt takes it.
        self.delivered: Grant | None = None
        #: A hand-off to this waiter failed half-way: the server may have granted it.
        self.uncertain = False
        #: An attempt of this waiter is on its way to the server.
        self.attempting = False
        #: An attempt of this waiter returned a grant.
        self.granted = False
        #: The waiter is being left.
        self.closing = False
        #: A wake-up was consumed and the attempt it calls for has not been made yet.
        self.woken = False
        #: Since when (monotonic) a release message reaches this process on the waiter's
        #: channel, as it was when the waiter entered (see the Waiter protocol): the core
        #: then does not repeat an attempt made since.
        self.listening_since: float | None = None

    async def wait(self, timeout: float | None) -> None:
        event = self._slot.event
        await (self._asleep if self._listening() else self._polling).wait(timeout)
        if self._slot.event is not event:  # a wake-up came (and was consumed)
            self._backoff.reset()
            self.woken = True

    def wake(self) -> None:
        """Wake this waiter (whatever the others on its channel are doing)."""
        self._slot.event.set()


class LocalWaiting:
    """The waiters of one :class:`~.backend.RedisBackend` in this process, and the
    same-process hand-off of non-fair locks between them.

    A release by this process hands the lock straight to one of its local waiters in one
    round trip (:meth:`transfer`, the RELEASE_TRANSFER script); a plain release whose message
    will wake a local waiter reserves the name's next attempt for it (:meth:`released`).
    """

    def __init__(self, op_timeout: float) -> None:
        self.op_timeout = op_timeout
        self.board = WakeupBoard()
        #: By name, the next attempt reserved for the local waiter a release by this
        #: process woke.
        self.reservations = Reservations(min(0.1, op_timeout))
        #: The waiters of this process by (name, owner).
        self.waiters: dict[tuple[str, str], HubWaiter] = {}
        #: Non-fair waiters of this process by name then owner, oldest first: a release
        #: hands the lock straight to one of them.
        self.local: dict[str, dict[str, HubWaiter]] = {}

    # -- an attempt ------------------------------------------------------------------------

    def before_attempt(
        self, waiter: HubWaiter | None, request: Request, will_wait: bool
    ) -> Grant | Busy | bool:
        """What this process decides before asking the server: a grant a hand-off delivered,
        a Busy while the next attempt is reserved for another local waiter, or (ask the
        server) whether this attempt is the reserved one (then :meth:`attempted` ends it).

        NOTE: a hand-off to ``waiter`` in flight (``waiter.transfer``) must be waited for
        first: its answer decides (asking the server meanwhile could take the same grant
        twice).  (Not in here: this is called on every contended attempt, a coroutine less.)
        """
        name = request.name
        if waiter is not None:
            delivered = waiter.delivered
            if delivered is not None:
                # Handed over by a release of this process: no round trip.
                waiter.delivered = None
                waiter.woken = False
                waiter.granted = True
                return delivered
        handoff = False
        if self.reservations and will_wait and not request.fair:
            woken = waiter is not None and waiter.woken
            barred = self.reservations.bar(name, woken)
            if barred is not None:
                # NOTE: a release by this process just woke one of its waiters: do not
                # barge past it (the releasing task itself asking again, typically).
                return Busy(barred)
            handoff = woken and name in self.reservations  # (this attempt is the reserved one)
        if waiter is not None:
            waiter.woken = False
            # NOTE: no await since the check of waiter.delivered: a release either handed
            # over before (taken above) or sees this flag and picks another waiter.
            waiter.attempting = True
        return handoff

    def attempted(self, waiter: HubWaiter | None, name: str, handoff: bool) -> None:
        """The attempt :meth:`before_attempt` allowed was answered (or failed)."""
        if handoff:
            self.reservations.end(name)
        if waiter is not None:
            waiter.attempting = False

    # -- a release -------------------------------------------------------------------------

    def receiver(self, name: str, releaser: str) -> HubWaiter | None:
        """The oldest local non-fair waiter of ``name`` that may receive a hand-off now."""
        waiters = self.local.get(name)
        if not waiters:
            return None
        for owner, waiter in waiters.items():
            if (
                owner != releaser
                and waiter.transfer is None
                and waiter.delivered is None
                and not waiter.attempting
                and not waiter.closing
            ):
                return waiter
        return None

    def released(self, name: str, keys: LockKeys, hub: PubSubHub | None) -> None:
        """A release by this process freed ``name``: reserve the next attempt for the local
        waiter its message will wake.

        NOTE: only when the subscription is confirmed: before that the message is lost, and
        reserving the next attempt for a waiter that is never woken would stall every local
        task for the whole hand-off window (seen as ~100 ms at the first contention).
        """
        if self.board.count(keys.channel_key) and hub is not None and hub.is_ready(keys.channel):
            self.reservations.reserve(name)

    async def transfer(
        self,
        node: RedisNode,
        hub: PubSubHub | None,
        grant: Grant,
        data: GrantData,
        waiter: HubWaiter,
    ) -> bool | None:
        """Release ``grant`` handing the lock to ``waiter`` (one round trip).

        Returns what a release returns, or None when the script failed (the caller then
        releases the usual way).
        """
        keys = data.keys
        done = asyncio.Event()
        waiter.transfer = done
        ttl = waiter.ttl
        started = monotonic()  # before sending: the delivered lease is conservative
        try:
            value = await node.release_transfer(
                keys, grant.owner, data.token, waiter.owner, ms(ttl)
            )
        except BaseException as exc:
            # The script may or may not have run: the waiter asks the server itself (an
            # attempt by an owner that holds the lock gets it again), and if it leaves
            # without a grant its exit compare-and-deletes by owner.
            waiter.uncertain = True
            waiter.transfer = None
            done.set()
            waiter.wake()
            if isinstance(exc, BackendError):
                return None
            raise
        if value > 0:
            waiter.delivered = Grant(
                grant.name, waiter.owner, value, started + ttl, GrantData(keys, str(value), False)
            )
        waiter.transfer = None
        done.set()
        if value > 0:
            waiter.wake()
            return True
        if value < 0:
            # Released without a hand-over (a fair queue exists): as a release does.
            self.released(grant.name, keys, hub)
            return True
        return False

    async def settle(
        self,
        waiter: HubWaiter,
        keys: LockKeys,
        node: RedisNode,
        release: Callable[[Grant], Awaitable[bool]],
    ) -> None:
        """A waiter leaves (granted, timed out, cancelled): give back what a hand-off left it.

        Runs in the waiting owner's own task, so that owner cannot meanwhile ask again.
        """
        transfer = waiter.transfer
        if transfer is not None:
            # The releaser's round trip is bounded by op_timeout.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.op_timeout * 2):
                    await transfer.wait()
        delivered, waiter.delivered = waiter.delivered, None
        try:
            if delivered is not None:
                # Never taken (the waiter timed out or was cancelled as it came): release
                # it, which may hand it on to another waiter of this process.
                await release(delivered)
            elif waiter.uncertain and not waiter.granted:
                # A hand-off failed half-way and may have granted: compare-and-delete.
                await node.abandon(keys, waiter.owner)
        except Exception:
            log.warning(
                "aiodlock: could not give back a lock handed to a leaving waiter of %r; the "
                "server lets it expire with its lease",
                keys.name,
                exc_info=True,
            )


class Waiting:
    """:meth:`RedisBackend.waiter`: one owner waiting for a name (a class, not a generator:
    every contended acquisition enters and leaves one).

    Entering takes a place on the board, then the name's channel (a fair waiter: its own
    channel, so a release wakes only the next in line), then registers the waiter for
    same-process hand-offs; leaving undoes it in the reverse order, first giving back what
    a hand-off left the waiter (``settle``, shielded: this may run because the task was
    cancelled).
    """

    __slots__ = (
        "_channel",
        "_hub",
        "_key",
        "_keys",
        "_local",
        "_request",
        "_settle",
        "_slot",
        "_state",
        "_waiter",
        "_waiting",
    )

    def __init__(
        self,
        waiting: LocalWaiting,
        hub: PubSubHub,
        keys: LockKeys,
        request: Request,
        settle: Callable[[HubWaiter, LockKeys], Awaitable[None]],
    ) -> None:
        self._waiting = waiting
        self._hub = hub
        self._keys = keys
        self._request = request
        self._settle = settle

    async def __aenter__(self) -> HubWaiter:
        request = self._request
        keys = self._keys
        channel = keys.waiter_channel(request.owner) if request.fair else keys.channel
        self._channel = channel
        hub = self._hub
        board = self._waiting.board
        self._key = (request.name, request.owner)
        slot = self._slot = board.add(channel.decode("latin-1"))
        try:
            state = self._state = await hub.subscribe(channel)
        except BaseException:
            board.remove(slot)
            raise
        try:
            return self._register(slot, state)
        except BaseException:  # pragma: no cover - (no await in there: a bug)
            hub.leave(channel, state)
            board.remove(slot)
            raise

    def _register(self, slot: Slot, state: Channel) -> HubWaiter:
        waiting = self._waiting
        request = self._request
        waiter = self._waiter = HubWaiter(
            slot,
            functools.partial(self._hub.is_ready, self._channel),
            owner=request.owner,
            ttl=request.ttl,
        )
        if state.missed:
            # A release came while no local waiter listened: try again at once.
            state.missed = 0
            slot.event.set()
        waiter.listening_since = state.ready_since
        waiting.waiters[self._key] = waiter
        local: dict[str, HubWaiter] | None = None
        if not request.fair:
            local = waiting.local.setdefault(request.name, {})
            local[request.owner] = waiter
        self._local = local
        return waiter

    async def __aexit__(self, *exc_info: object) -> None:
        waiting = self._waiting
        request = self._request
        waiter = self._waiter
        try:
            waiter.closing = True
            key = self._key
            if waiting.waiters.get(key) is waiter:
                del waiting.waiters[key]
            local = self._local
            if local is not None and local.get(request.owner) is waiter:
                del local[request.owner]
                if not local and waiting.local.get(request.name) is local:
                    del waiting.local[request.name]
            if (
                waiter.transfer is not None
                or waiter.delivered is not None
                or (waiter.uncertain and not waiter.granted)
            ):
                with anyio.CancelScope(shield=True):
                    await self._settle(waiter, self._keys)
        finally:
            self._hub.leave(self._channel, self._state)
            waiting.board.remove(self._slot)
