"""Redlock: the waiters of this process and what it knows of each name.

:class:`RedlockLocal` keeps the waiters, the names this process holds or is asking for, the
random pauses of split votes and the reservation of the next attempt for the waiter a local
release woke; :class:`RedlockWaiting` is one owner waiting for one name (on every node's
pub/sub hub).  Local policy, kept apart from the quorum so that it can move into the core.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, Protocol

from ..._types import Busy, Waiter, monotonic
from ..._wakeup import Reservations, Slot, Wakeup, WakeupBoard
from ._pubsub import PubSubHub


class LocalName:
    """What this process knows about one Redlock name (keyed by the name's channel)."""

    __slots__ = ("attempts", "holder", "holder_until", "missed")

    def __init__(self) -> None:
        self.holder: str | None = None  # a local owner holding it ...
        self.holder_until = 0.0  # ... until then (its validity)
        self.attempts = 0  # local attempts in flight
        self.missed = False  # a release message came while an attempt was in flight


class RedlockBoard(WakeupBoard):
    """The local waiters by name, woken by the pub/sub hubs of ALL nodes.

    A release is announced by every node that held the key, so one release arrives up to N
    times: a message wakes one waiter only when no wake-up is already on its way and no
    local attempt, hold or hand-off makes an attempt pointless right now.
    """

    def __init__(self, quiet: Callable[[str], bool], ready: Callable[[str, object], bool]) -> None:
        super().__init__()
        self._quiet = quiet
        self._ready = ready

    def wake_one(self, name: str, may_go: Callable[[object], bool] | None = None) -> bool:
        if name not in self or self.pending(name) or self._quiet(name):
            return False
        return super().wake_one(name, may_go)

    def wake_direct(self, name: str) -> bool:
        """Wake one waiter after a release by this process (no message needed): the oldest
        that may ask now (not one pausing after a split vote, which would not ask before
        its pause ends and would hold back the reservation made for it)."""
        if self.pending(name):
            return False
        return super().wake_one(name, lambda owner: self._ready(name, owner))


class RedlockLocal:
    """A Redlock backend's local state: its waiters, the random pauses of split votes, the
    names this process holds or is asking for, and the reservation of the next attempt
    for the waiter a local release woke."""

    def __init__(self, op_timeout: float, retry_delay: float) -> None:
        self.retry_delay = retry_delay
        self.board = RedlockBoard(self.quiet, self.ready)
        self.names: dict[str, LocalName] = {}
        self._limit = 1024
        self.waiters: dict[tuple[str, str], RedlockWaiter] = {}
        #: (channel key, owner) -> no attempt before then (the random pause of a split vote)
        self.not_before: dict[tuple[str, str], float] = {}
        #: channel key -> until when a local release reserves the next attempt for the
        #: local waiter it woke
        self.reservations = Reservations(min(0.1, op_timeout))

    def poll_interval(self) -> float:
        delay = self.retry_delay
        return random.uniform(delay / 2, delay)

    def ready(self, channel_key: str, owner: object) -> bool:
        """May ``owner`` ask now (it is not pausing after a split vote)?"""
        if not self.not_before or not isinstance(owner, str):
            return True
        until = self.not_before.get((channel_key, owner))
        return until is None or until <= monotonic()

    def quiet(self, channel_key: str) -> bool:
        """Is a release message on this channel of no use to local waiters right now?"""
        if self.reservations.active(channel_key):
            return True  # a local release already woke a waiter
        now = monotonic()
        local = self.names.get(channel_key)
        if local is None:
            return False
        if local.attempts:
            local.missed = True  # wake one when the attempt fails
            return True
        return local.holder is not None and local.holder_until > now

    def tidy(self) -> None:
        # NOTE: an idle entry answers like a missing one, so it stays for the name's next
        # acquire (one object less per lock cycle) until there are many.
        if len(self.names) > self._limit:
            self.names = {k: v for k, v in self.names.items() if v.holder or v.attempts}
            self._limit = max(1024, 2 * len(self.names))

    def forget_holder(self, channel_key: str, owner: str) -> None:
        local = self.names.get(channel_key)
        if local is not None and local.holder == owner:
            local.holder = None
            local.missed = False
            self.tidy()

    def renewed(self, channel_key: str, owner: str, expires_at: float) -> None:
        local = self.names.get(channel_key)
        if local is not None and local.holder == owner:
            local.holder_until = expires_at

    def before_attempt(
        self, ckey: str, owner: str, will_wait: bool
    ) -> Busy | tuple[LocalName, bool]:
        """A Busy when this process knows an attempt is pointless now; else the name's
        local state (its attempt counted) and whether this attempt is the reserved one."""
        key = (ckey, owner)
        now = monotonic()
        local = self.names.get(ckey)
        if local is not None and local.holder not in (None, owner) and local.holder_until > now:
            # Another task of this process holds it: no need to ask the servers.
            return Busy(local.holder_until - now)
        handoff = False
        if will_wait:
            if self.not_before:
                until = self.not_before.get(key)
                if until is not None:
                    if until > now:
                        return Busy(until - now)
                    del self.not_before[key]
            waiter = self.waiters.get(key)
            woken = waiter is not None and waiter.woken
            if waiter is not None:
                waiter.woken = False
            if self.reservations:
                # NOTE: do not barge past the waiter that a local release woke (the
                # releasing task asking again, typically); that waiter makes its attempt.
                left = self.reservations.bar(ckey, woken)
                if left is not None:
                    return Busy(left)
                handoff = woken and ckey in self.reservations
            if local is not None and local.attempts:
                # Two local owners cannot both win: they would only split the vote.  The
                # attempt in flight wakes a waiter if it fails after a release message came.
                return Busy(None)
        if local is None:
            local = self.names[ckey] = LocalName()
        local.attempts += 1
        return local, handoff

    def after_attempt(
        self, ckey: str, local: LocalName, handoff: bool, owner: str, until: float | None
    ) -> None:
        """The attempt :meth:`before_attempt` counted ended: granted until ``until``, or not
        granted (None)."""
        if until is not None:
            local.holder = owner
            local.holder_until = until
        if handoff:
            self.reservations.end(ckey)
        local.attempts -= 1
        if local.missed and not local.attempts:
            local.missed = False
            if until is None:
                self.board.wake_direct(ckey)
        self.tidy()

    def pause(self, ckey: str, owner: str, pause: float) -> None:
        """No attempt of ``owner`` before ``pause`` seconds from now (a split vote)."""
        self.not_before[(ckey, owner)] = monotonic() + pause
        if len(self.not_before) > 4096:
            now = monotonic()
            for key, until in list(self.not_before.items()):
                if until <= now:
                    del self.not_before[key]

    def abandoned(self, ckey: str, owner: str) -> None:
        self.not_before.pop((ckey, owner), None)

    def released(self, ckey: str, owner: str) -> None:
        """A release by this process ended (whatever its outcome)."""
        self.forget_holder(ckey, owner)
        board = self.board
        if board.count(ckey) and (board.pending(ckey) or board.wake_direct(ckey)):
            # A local waiter is woken (at once: no need to wait for a message), unless all
            # of them pause after a split vote: reserve the next attempt for it, the
            # releasing task must not barge back in.
            self.reservations.reserve(ckey)


class RedlockWaiter(Waiter):
    """Sleeps until a release message, a random poll interval or the given timeout.

    After a split vote the owner pauses for a random time that wake-ups do not cut short
    (otherwise the contenders' clean-up messages would make them collide again at once).
    """

    __slots__ = ("_key", "_local", "_slot", "listening_since", "woken")

    def __init__(self, local: RedlockLocal, slot: Slot, key: tuple[str, str]) -> None:
        self._local = local
        self._slot = slot
        self._key = key
        #: A wake-up was consumed and the attempt it calls for has not been made yet.
        self.woken = False
        #: Since when a majority of the nodes has the channel confirmed, as it was when the
        #: waiter entered (see the Waiter protocol; the random polling covers the rest).
        self.listening_since: float | None = None

    def _consume(self) -> bool:
        if not self._slot.event.is_set():
            return False
        self._slot.event = Wakeup()
        self.woken = True
        return True

    async def wait(self, timeout: float | None) -> bool:
        local = self._local
        slot = self._slot
        until = local.not_before.get(self._key)
        if until is not None:
            pause = until - monotonic()
            if pause > 0:
                await asyncio.sleep(pause if timeout is None else min(pause, timeout))
                return self._consume()
        limit = local.poll_interval()
        if timeout is not None:
            limit = min(limit, timeout)
        await slot.event.wait(limit)
        return self._consume()


class Hubs(Protocol):
    """What a Redlock waiter needs of its backend: the nodes' hubs and the quorum."""

    def hubs(self) -> list[PubSubHub]: ...

    def majority_since(self, channel: bytes) -> float | None: ...

    async def await_subscriptions(self, channel: bytes, tasks: list[asyncio.Task[Any]]) -> None: ...


class RedlockWaiting:
    """:meth:`RedlockBackend.waiter`: one owner waiting for a name (a class, not generator
    context managers: every contended acquisition enters and leaves one).

    Entering takes a place on the board, then the name's channel on every node: it waits
    (briefly) until a majority of the nodes confirmed the subscription, since a holder's
    release reaches a majority, so at least one of its messages then reaches us.  Nodes
    that are down or slow are not waited for; their subscription completes (or not) in the
    background, and the waiter's random polling covers the rest.  Leaving undoes it all.
    """

    __slots__ = (
        "_channel",
        "_entered",
        "_entering",
        "_hubs",
        "_key",
        "_local",
        "_owner",
        "_slot",
        "_waiter",
    )

    def __init__(self, local: RedlockLocal, hubs: Hubs, channel: bytes, owner: str) -> None:
        self._local = local
        self._hubs = hubs
        self._channel = channel
        self._owner = owner

    async def __aenter__(self) -> RedlockWaiter:
        local = self._local
        channel = self._channel
        ckey = channel.decode("latin-1")
        key = self._key = (ckey, self._owner)
        slot = self._slot = local.board.add(ckey, self._owner)
        self._waiter: RedlockWaiter | None = None
        #: (hub, its channel state) subscribed, and (hub, task) still subscribing
        self._entered: list[tuple[PubSubHub, Any]] = []
        self._entering: list[tuple[PubSubHub, asyncio.Task[Any]]] = []
        try:
            for hub in self._hubs.hubs():
                if hub.is_ready(channel):
                    # (returns at once: already subscribed)
                    self._entered.append((hub, await hub.subscribe(channel)))
                else:
                    task = asyncio.get_running_loop().create_task(hub.subscribe(channel))
                    self._entering.append((hub, task))
            if self._entering:
                await self._hubs.await_subscriptions(channel, [task for _, task in self._entering])
        except BaseException:
            self._leave()
            raise
        waiter = self._waiter = RedlockWaiter(local, slot, key)
        waiter.listening_since = self._hubs.majority_since(channel)
        local.waiters[key] = waiter
        return waiter

    async def __aexit__(self, *exc_info: object) -> None:
        local = self._local
        key = self._key
        if local.waiters.get(key) is self._waiter:
            del local.waiters[key]
        local.not_before.pop(key, None)
        self._leave()

    def _leave(self) -> None:
        channel = self._channel
        for hub, state in self._entered:
            hub.leave(channel, state)
        for hub, task in self._entering:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    hub.leave(channel, task.result())
            else:
                # (a cancelled subscribe leaves by itself)
                task.cancel()
        self._local.board.remove(self._slot)
