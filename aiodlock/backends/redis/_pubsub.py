"""The pub/sub side of both Redis backends: one connection per backend (or Redlock node)
shared by all of its waiters (:class:`PubSubHub`), and the waiter that listens on it
(:class:`Listening`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._errors import describe
from ..._types import monotonic
from ..._wakeup import Backoff, BoardWaiter, Slot, Timer, WakeupBoard
from ._wire import Link, NodeConnectionError, Pipe, pack

if TYPE_CHECKING:
    from ..._types import CommonConfig

log = logging.getLogger("aiodlock")


#: What a release announces to whoever waits (any other message names the one it is for).
_ANYONE = (b"released", b"next")


class Channel:
    """What the hub knows about one channel."""

    def __init__(self, key: str) -> None:
        self.key = key  # the WakeupBoard key of its waiters
        self.wanted = 0  # local waiters
        self.requested = False  # the last command sent on this connection was SUBSCRIBE
        self.inflight = 0  # (UN)SUBSCRIBE commands sent and not yet answered
        self.ready = asyncio.Event()  # subscribed, and no command in flight
        self.since: float | None = None  # when ``ready`` was last set
        self.wake = False  # wake every waiter once ready (after a reconnect)
        self.missed = 0  # messages that found no local waiter to wake
        self.linger: asyncio.TimerHandle | None = None  # the pending UNSUBSCRIBE

    def set_ready(self, ready: bool) -> None:
        (self.ready.set if ready else self.ready.clear)()
        self.since = monotonic() if ready else None


class PubSubHub:
    """One pub/sub connection shared by every waiter of one backend (or Redlock node).

    A channel is subscribed when its first local waiter arrives (which waits, bounded, until
    the server confirmed it, so a release after its attempt cannot be missed), unsubscribed
    after the last one left.  A message wakes ONE local waiter.  The connection is PINGed
    when idle; after a reconnect every waiter of each restored channel is woken.
    """

    def __init__(
        self,
        link: Link,
        board: WakeupBoard,
        config: CommonConfig,
        label: str,
        secrets: tuple[str, ...],
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.link = link
        link.on_push = self._dispatch
        self._on_reconnect = on_reconnect
        self.board, self.label, self._secrets = board, label, secrets
        self.op_timeout = config.op_timeout
        self.ping_interval = max(1.0, min(10.0, config.watchdog_ttl / 3))
        self._channels: dict[bytes, Channel] = {}
        self._pipe: Pipe | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.linger = 1.0  # seconds a subscription outlives its last local waiter
        self._served = False  # a connection was made before (so messages may be missed)
        self.connected = asyncio.Event()

    def is_ready(self, channel: bytes) -> bool:
        return self.ready_since(channel) is not None

    def ready_since(self, channel: bytes) -> float | None:
        """Since when ``channel`` is confirmed without interruption, or None."""
        state = self._channels.get(channel)
        return None if state is None else state.since

    def channels(self) -> list[bytes]:
        """Channels this process is subscribed to (or subscribing to) now."""
        return [ch for ch, st in self._channels.items() if st.wanted]

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.link.close()

    async def subscribe(self, channel: bytes) -> Channel:
        """Be subscribed to ``channel`` until :meth:`leave`: once the server confirmed it, or
        after ``op_timeout`` (the connection is down: the waiter polls).  It lingers ``linger``
        s after its last waiter left (a task that waits again pays no SUBSCRIBE round trip).
        If this raises, it left already."""
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = Channel(channel.decode("latin-1"))
        state.wanted += 1
        if state.linger is not None:
            state.linger.cancel()
        try:
            if self._task is None and not self._closed:
                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name=f"aiodlock:{self.label}:pubsub"
                )
            if not state.requested and self._pipe is not None:
                self._request(self._pipe, channel, state, True)
            if not state.ready.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.op_timeout):
                        await state.ready.wait()
        except BaseException:
            self.leave(channel, state)
            raise
        return state

    def leave(self, channel: bytes, state: Channel) -> None:
        """One local waiter no longer needs ``channel``."""
        state.wanted -= 1
        if state.wanted == 0:
            if state.requested and self._pipe is not None:
                loop = asyncio.get_running_loop()
                state.linger = loop.call_later(self.linger, self._unsubscribe, channel, state)
            elif state.inflight == 0 and self._channels.get(channel) is state:
                del self._channels[channel]

    def _unsubscribe(self, channel: bytes, state: Channel) -> None:
        if state.wanted or self._channels.get(channel) is not state:
            return
        if state.requested and self._pipe is not None:
            self._request(self._pipe, channel, state, False)
        elif state.inflight == 0:
            del self._channels[channel]

    def _request(self, pipe: Pipe, channel: bytes, state: Channel, subscribe: bool) -> None:
        """Send (UN)SUBSCRIBE: the channel is not ready until the server answered."""
        state.requested = subscribe
        state.inflight += 1
        state.missed = 0  # (0 already when not requested: no message counts then)
        state.set_ready(False)
        pipe.send(pack(b"SUBSCRIBE" if subscribe else b"UNSUBSCRIBE", channel), ())

    async def _run(self) -> None:
        backoff = Backoff(first=0.02, cap=1.0)
        link = self.link
        while not self._closed:
            try:
                async with asyncio.timeout(link.connect_timeout + self.op_timeout):
                    pipe = await link.connect()
                backoff.reset()
                await self._serve(pipe)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason = describe(exc, self._secrets)
                log.debug("aiodlock: %s pub/sub connection lost: %s", self.label, reason)
            finally:
                self._pipe = None
                self.connected.clear()
                for channel, state in list(self._channels.items()):
                    state.requested = False
                    state.inflight = state.missed = 0
                    state.set_ready(False)
                    if state.linger is not None:
                        state.linger.cancel()
                    if not state.wanted:
                        del self._channels[channel]
                link.drop(NodeConnectionError("the pub/sub connection was given up"))
            await asyncio.sleep(backoff.next())

    async def _serve(self, pipe: Pipe) -> None:
        # NOTE: no await between collecting the wanted channels and publishing the
        # connection: a waiter arriving later sends its own SUBSCRIBE on this connection.
        wanted = self.channels()
        reconnect, self._served = self._served, True
        for channel in wanted:
            state = self._channels[channel]
            state.requested = True
            state.inflight = 1
            # After a reconnect messages may have been missed: wake every waiter once the
            # channel is back (the first time, they make their attempt right after anyway).
            state.wake = reconnect
        self._pipe = pipe
        if wanted:
            pipe.send(pack(b"SUBSCRIBE", *wanted), ())
        self.connected.set()
        if reconnect and self._on_reconnect is not None:
            self._on_reconnect()  # (a restart or failover: the command links, too)
        # (ping_interval after the last thing read, a PING; nothing for op_timeout: give up)
        sent: float | None = None  # when the unanswered PING went

        def due(now: float) -> float | None:
            nonlocal sent
            if sent is not None:
                if pipe.last < sent:
                    pipe.close(NodeConnectionError(f"no answer to PING within {self.op_timeout} s"))
                    return None
                sent = None
            if pipe.last + self.ping_interval > now:
                return pipe.last + self.ping_interval
            pipe.send(pack(b"PING"), ())
            sent = now
            return now + self.op_timeout

        silence = Timer(due)
        silence.at(monotonic() + self.ping_interval)
        try:
            raise await asyncio.shield(pipe.lost)
        finally:
            silence.cancel()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind, channel = reply[0], reply[1]
        state = self._channels.get(channel)
        if state is None:
            return
        if kind == b"message":
            if not state.requested:
                return
            said = reply[2] if len(reply) > 2 else b""
            if said not in _ANYONE:
                # The lock is kept for the first waiter in line, whom the message names: wake
                # it if it waits here (nobody else may take the lock).
                self.board.wake_tagged(state.key, said)
            elif not self.board.wake_one(state.key):
                # Nobody to wake: the next local waiter makes an attempt at once (it may
                # have made its last one before this release).
                state.missed += 1
            return
        if kind in (b"subscribe", b"unsubscribe"):
            state.inflight = max(0, state.inflight - 1)
        if state.inflight:
            return
        if kind == b"subscribe" and state.requested:
            state.set_ready(True)
            if state.wake:
                state.wake = False
                self.board.wake_all(state.key)
        elif kind == b"unsubscribe" and not state.wanted and not state.requested:
            del self._channels[channel]


class Listening:
    """The waiter of both Redis backends: a place on the board, then ``channel`` on every
    hub.  With several hubs (Redlock's nodes) entering waits, at most ``bound`` seconds, until
    ``need`` of them confirmed the channel: a holder's release reaches a majority, so one of
    its messages then reaches us (polling covers what the others miss).  ``tag`` names the
    waiter in a message that calls it alone."""

    __slots__ = ("_board", "_channel", "_entered", "_entering", "_hubs", "_slot", "_with")

    def __init__(
        self,
        board: WakeupBoard,
        hubs: Sequence[PubSubHub],
        channel: bytes,
        tag: object,
        backoff: Backoff,
        *,
        need: int = 1,
        bound: float = 0.0,
        listen: bool = True,
    ) -> None:
        self._board, self._hubs, self._channel = board, hubs, channel
        self._slot: Slot | None = None
        self._with = (tag, backoff, need, bound, listen)
        #: (hub, its channel state) subscribed, and (hub, task) still subscribing
        self._entered: list[tuple[PubSubHub, Channel]] = []
        self._entering: list[tuple[PubSubHub, asyncio.Task[Channel]]] = []

    async def __aenter__(self) -> BoardWaiter:
        channel, hubs = self._channel, self._hubs
        tag, backoff, need, bound, listen = self._with
        slot = self._slot = self._board.add(channel.decode("latin-1"), tag)
        try:
            for hub in hubs:
                if len(hubs) == 1 or hub.is_ready(channel):
                    # (at once when already subscribed; else bounded by op_timeout)
                    self._entered.append((hub, await hub.subscribe(channel)))
                else:
                    task = asyncio.get_running_loop().create_task(hub.subscribe(channel))
                    self._entering.append((hub, task))
            if self._entering:
                await self._confirmed(need, bound)
        except BaseException:
            self._leave()
            raise
        for _, state in self._entered:
            if state.missed and listen:
                # A release came while no local waiter listened: try again at once.  (A
                # waiter that polls anyway, Redlock's, does not: each node announces it.)
                state.missed = 0
                slot.event.set()
        ready = functools.partial(hubs[0].is_ready, channel) if len(hubs) == 1 and listen else None
        waiter = BoardWaiter(slot, backoff, ready)
        since = sorted(t for t in (hub.ready_since(channel) for hub in hubs) if t is not None)
        waiter.listening_since = since[need - 1] if len(since) >= need else None
        return waiter

    async def _confirmed(self, need: int, bound: float) -> None:
        """Until ``need`` hubs confirmed the channel (or every subscription ended)."""
        deadline = monotonic() + bound
        pending = {task for _, task in self._entering}
        while pending and sum(hub.is_ready(self._channel) for hub in self._hubs) < need:
            left = deadline - monotonic()
            if left <= 0:
                return
            _, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )

    async def __aexit__(self, *exc_info: object) -> None:
        self._leave()

    def _leave(self) -> None:
        channel = self._channel
        for hub, state in self._entered:
            hub.leave(channel, state)
        for hub, task in self._entering:
            if not task.done():
                task.cancel()  # (a cancelled subscribe leaves by itself)
            elif not task.cancelled() and task.exception() is None:
                hub.leave(channel, task.result())
        if self._slot is not None:
            self._board.remove(self._slot)
