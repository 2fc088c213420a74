"""PubSubHub: one pub/sub connection shared by every waiter of a backend (or a Redlock node)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from ..._errors import describe
from ..._wakeup import Backoff, WakeupBoard
from .._base import (
    monotonic,
)

log = logging.getLogger("aiodlock")


class Channel:
    """What the hub knows about one channel."""

    __slots__ = (
        "inflight",
        "key",
        "linger",
        "missed",
        "on_server",
        "ready",
        "ready_since",
        "requested",
        "wake_when_ready",
        "wanted",
    )

    def __init__(self, key: str) -> None:
        self.key = key  # the WakeupBoard key of its waiters
        self.wanted = 0  # local waiters
        self.requested = False  # the last command sent on this connection was SUBSCRIBE
        self.inflight = 0  # (UN)SUBSCRIBE commands sent and not yet answered
        self.on_server = False  # the server has us subscribed (as of the last answer)
        self.ready = asyncio.Event()  # subscribed, and no command in flight
        self.ready_since: float | None = None  # monotonic time ``ready`` was last set
        self.wake_when_ready = False  # wake every waiter once ready (after a reconnect)
        self.missed = 0  # messages that found no local waiter to wake
        self.linger: asyncio.TimerHandle | None = None  # the pending UNSUBSCRIBE

    def set_ready(self) -> None:
        self.ready.set()
        self.ready_since = monotonic()

    def clear_ready(self) -> None:
        self.ready.clear()
        self.ready_since = None


class _HubDown(RedisConnectionError):
    """The pub/sub connection stopped answering PING."""


class _QuietWatch:
    """Notices a pub/sub connection that went silent: ``interval`` seconds after the last
    thing read it sends PING; when nothing has come ``patience`` seconds later, it cancels
    the reading ``task`` (which then sees :attr:`expired`).  One timer per connection, not
    a timeout per message read."""

    __slots__ = ("_handle", "_interval", "_patience", "_send", "_task", "clock", "expired", "last")

    def __init__(
        self,
        task: asyncio.Task[Any],
        interval: float,
        patience: float,
        send: Callable[..., None],
    ) -> None:
        loop = asyncio.get_running_loop()
        self._task = task
        self._interval = interval
        self._patience = patience
        self._send = send
        #: The loop's clock; the reader sets :attr:`last` from it per message.
        self.clock = loop.time
        #: When something was last read.
        self.last = loop.time()
        #: The PING went unanswered: the task was cancelled for it.
        self.expired = False
        self._handle = loop.call_later(interval, self._quiet)

    def _quiet(self) -> None:
        """Due ``interval`` after the last read, unless something came since."""
        loop = asyncio.get_running_loop()
        left = self.last + self._interval - loop.time()
        if left > 0:
            self._handle = loop.call_later(left, self._quiet)
            return
        sent = loop.time()
        self._send(b"PING")
        self._handle = loop.call_later(self._patience, self._answered, sent)

    def _answered(self, sent: float) -> None:
        """Due ``patience`` after a PING."""
        if self.last >= sent:
            self._quiet()
            return
        self.expired = True
        self._task.cancel()

    def stop(self) -> None:
        self._handle.cancel()


class PubSubHub:
    """One pub/sub connection shared by every waiter of one backend (all names).

    A waiter subscribes to its channel (:meth:`subscribe`) before its next attempt; the hub
    subscribes when the first local waiter of a channel arrives (and waits, bounded, until
    the server confirmed it, so a release after the attempt cannot be missed) and
    unsubscribes when the last one leaves.  A message wakes ONE local waiter of that channel
    (through the :class:`~aiodlock._waiting.WakeupBoard`).  The connection is PINGed when
    idle; when it breaks, the hub reconnects with backoff, subscribes again and then wakes
    every waiter of each restored channel (messages may have been missed meanwhile).
    Until a channel is confirmed, its waiters also poll with backoff.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[AbstractConnection]],
        board: WakeupBoard,
        *,
        op_timeout: float,
        connect_timeout: float,
        ping_interval: float,
        label: str = "redis",
        secrets: tuple[str, ...] = (),
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self._connect = connect
        self._on_reconnect = on_reconnect
        self.board = board
        self.op_timeout = op_timeout
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.label = label
        self._secrets = secrets
        self._channels: dict[bytes, Channel] = {}
        self._conn: AbstractConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._outbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._outbox_event = asyncio.Event()
        self._closed = False
        #: Seconds a subscription outlives its last local waiter.
        self.linger = 1.0
        #: Connections made so far (the first one included): for tests.
        self.connections = 0
        #: Set while connected.
        self.connected = asyncio.Event()

    # -- public ----------------------------------------------------------------------------

    def is_ready(self, channel: bytes) -> bool:
        state = self._channels.get(channel)
        return state is not None and state.ready.is_set()

    def channels(self) -> list[bytes]:
        """Channels this process is subscribed to (or subscribing to) now."""
        return [ch for ch, st in self._channels.items() if st.wanted]

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"aiodlock:{self.label}:pubsub"
            )

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ready_since(self, channel: bytes) -> float | None:
        """Since when (monotonic) ``channel`` is confirmed without interruption, or None."""
        state = self._channels.get(channel)
        return None if state is None else state.ready_since

    async def subscribe(self, channel: bytes) -> Channel:
        """Be subscribed to ``channel`` (shared with other local waiters) until :meth:`leave`.

        Returns once the server confirmed it, or after ``op_timeout`` (the pub/sub
        connection is down: the waiter then polls).  The subscription lingers for
        ``linger`` seconds after the last local waiter left, so a task that waits again at
        once (a loop on a contended lock, a fair waiter on its own channel) does not pay a
        SUBSCRIBE round trip each time.  If this raises (a cancellation), it left already.
        """
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = Channel(channel.decode("latin-1"))
        state.wanted += 1
        if state.linger is not None:
            state.linger.cancel()
            state.linger = None
        try:
            self.start()
            if not state.requested and self._conn is not None:
                state.requested = True
                state.inflight += 1
                state.clear_ready()
                self._send(b"SUBSCRIBE", channel)
            if not state.ready.is_set():
                # Bounded: if the pub/sub connection is down the waiter polls instead.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.op_timeout):
                        await state.ready.wait()
        except BaseException:
            self.leave(channel, state)
            raise
        return state

    def leave(self, channel: bytes, state: Channel) -> None:
        """One local waiter no longer needs ``channel`` (see :meth:`subscribe`)."""
        state.wanted -= 1
        if state.wanted == 0:
            if state.requested and self._conn is not None:
                loop = asyncio.get_running_loop()
                state.linger = loop.call_later(self.linger, self._unsubscribe, channel, state)
            elif state.inflight == 0 and self._channels.get(channel) is state:
                del self._channels[channel]

    def _unsubscribe(self, channel: bytes, state: Channel) -> None:
        state.linger = None
        if state.wanted or self._channels.get(channel) is not state:
            return
        if state.requested and self._conn is not None:
            state.requested = False
            state.inflight += 1
            state.missed = 0
            state.clear_ready()
            self._send(b"UNSUBSCRIBE", channel)
        elif state.inflight == 0:
            del self._channels[channel]

    # -- the connection ---------------------------------------------------------------------

    def _send(self, *args: Any) -> None:
        self._outbox.append(args)
        self._outbox_event.set()

    async def _run(self) -> None:
        backoff = Backoff(first=0.02, cap=1.0)
        while not self._closed:
            conn: AbstractConnection | None = None
            served = False
            try:
                async with asyncio.timeout(self.connect_timeout + self.op_timeout):
                    conn = await self._connect()
                served = True
                await self._serve(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug(
                    "aiodlock: %s pub/sub connection lost: %s",
                    self.label,
                    describe(exc, self._secrets),
                )
            finally:
                self._disconnected()
                if conn is not None:
                    with (
                        anyio.CancelScope(shield=True),
                        anyio.move_on_after(1.0),
                        contextlib.suppress(Exception),
                    ):
                        await conn.disconnect(nowait=True)
            if served:
                backoff.reset()
            await asyncio.sleep(backoff.next())

    def _disconnected(self) -> None:
        self._conn = None
        self.connected.clear()
        self._outbox.clear()
        for channel, state in list(self._channels.items()):
            state.requested = False
            state.inflight = 0
            state.on_server = False
            state.missed = 0
            state.clear_ready()
            if state.linger is not None:
                state.linger.cancel()
                state.linger = None
            if not state.wanted:
                del self._channels[channel]

    async def _serve(self, conn: AbstractConnection) -> None:
        # NOTE: no await between collecting the wanted channels and publishing the
        # connection: a waiter arriving later sends its own SUBSCRIBE on this connection.
        self._outbox.clear()
        wanted = [ch for ch, st in self._channels.items() if st.wanted]
        reconnect = self.connections > 0
        for channel in wanted:
            state = self._channels[channel]
            state.requested = True
            state.inflight = 1
            # After a reconnect, messages may have been missed: wake every waiter once the
            # channel is back.  (On the first connection the waiters are still waiting for
            # the subscription, and they make their attempt right after it anyway.)
            state.wake_when_ready = reconnect
        if wanted:
            self._send(b"SUBSCRIBE", *wanted)
        self._conn = conn
        self.connections += 1
        self.connected.set()
        if reconnect and self._on_reconnect is not None:
            # The server may have restarted or failed over: so may the command connections.
            self._on_reconnect()
        writer = asyncio.get_running_loop().create_task(
            self._writer(conn), name=f"aiodlock:{self.label}:pubsub-writer"
        )
        try:
            await self._reader(conn, writer)
        finally:
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer

    async def _writer(self, conn: AbstractConnection) -> None:
        while True:
            await self._outbox_event.wait()
            self._outbox_event.clear()
            while self._outbox:
                args = self._outbox.popleft()
                await conn.send_command(*args, check_health=False)

    async def _reader(self, conn: AbstractConnection, writer: asyncio.Task[None]) -> None:
        task = asyncio.current_task()
        assert task is not None
        # NOTE: one timer for the connection's silence, not a timeout per message read
        # (redis-py's read_response(timeout=...) enters asyncio.timeout for every message).
        watch = _QuietWatch(task, self.ping_interval, self.op_timeout, self._send)
        try:
            while True:
                if writer.done():
                    writer.result()  # raises what broke the writer
                    raise _HubDown("the pub/sub writer stopped")
                try:
                    # (math.inf: no timeout of redis-py's own for this read)
                    reply = await conn.read_response(timeout=math.inf, push_request=True)
                except asyncio.CancelledError:
                    if watch.expired and task.uncancel() == 0:
                        raise _HubDown(f"no answer to PING within {self.op_timeout} s") from None
                    raise
                watch.last = watch.clock()  # anything that arrives proves the line alive
                if reply is not None:
                    self._dispatch(reply)
        finally:
            watch.stop()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = reply[0]
        if isinstance(kind, str):
            kind = kind.encode()
        channel = reply[1]
        if isinstance(channel, str):
            channel = channel.encode("latin-1")
        state = self._channels.get(channel)
        if kind == b"message":
            if state is not None and state.requested and not self.board.wake_one(state.key):
                # Nobody to wake right now: the next local waiter of this channel makes an
                # attempt at once (it may have made its last one before this release).
                state.missed += 1
        elif kind == b"subscribe":
            if state is None:
                return
            state.inflight = max(0, state.inflight - 1)
            state.on_server = True
            if state.inflight == 0 and state.requested:
                state.set_ready()
                if state.wake_when_ready:
                    state.wake_when_ready = False
                    self.board.wake_all(state.key)
        elif kind == b"unsubscribe":
            if state is None:
                return
            state.inflight = max(0, state.inflight - 1)
            state.on_server = False
            if state.inflight == 0 and not state.wanted and not state.requested:
                del self._channels[channel]
