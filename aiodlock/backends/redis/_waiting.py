"""Redis: waiting for a release message.

:class:`HubWaiter` is woken through the backend's :class:`~._pubsub.PubSubHub`;
:class:`Waiting` is one owner waiting for one name: a place on the board, and a channel.
A non-fair waiter listens on the name's channel, where each release is announced (or, while
owners wait in line, the first of them is called by name); a fair waiter on its own
channel, where only its turn is announced.  The hand-off between the waiters of one client
is the core's (``aiodlock._local``); this backend offers its one-round-trip step,
``transfer``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..._types import Request
from ..._wakeup import Backoff, BoardWaiter, Slot, WakeupBoard
from ._pubsub import PubSubHub
from ._scripts import LockKeys


class HubWaiter(BoardWaiter):
    """A waiter woken through a :class:`PubSubHub` (its slot on the hub's board).

    ``listening()`` tells whether a release would reach this waiter by message now (its
    channel is confirmed); while it does not, the waiter also polls with capped backoff.
    """

    __slots__ = ("_listening", "listening_since")

    def __init__(self, slot: Slot, listening: Callable[[], bool]) -> None:
        super().__init__(slot, Backoff())
        self._listening = listening
        #: Since when (monotonic) a release message reaches this process on the waiter's
        #: channel, as it was when the waiter entered (see the Waiter protocol): the core
        #: then does not repeat an attempt made since.
        self.listening_since: float | None = None

    def polling(self) -> bool:
        return not self._listening()

    def listening(self) -> bool:
        return self._listening()


class Waiting:
    """:meth:`RedisBackend.waiter`: one owner waiting for a name (a class, not a generator:
    every contended acquisition enters and leaves one).

    Entering takes a place on the board, then the channel; leaving undoes both.  A non-fair
    waiter's place is tagged with its owner: once it waits in line (urgent), the message
    that calls it names it.
    """

    __slots__ = ("_board", "_channel", "_hub", "_keys", "_request", "_slot", "_state")

    def __init__(
        self, board: WakeupBoard, hub: PubSubHub, keys: LockKeys, request: Request
    ) -> None:
        self._board = board
        self._hub = hub
        self._keys = keys
        self._request = request

    async def __aenter__(self) -> HubWaiter:
        request = self._request
        if request.fair:
            channel = self._keys.waiter_channel(request.owner)
            slot = self._board.add(channel.decode("latin-1"))
        else:
            channel = self._keys.channel
            tag = request.owner.encode("utf-8", "surrogatepass")
            slot = self._board.add(self._keys.channel_key, tag)
        try:
            state = await self._hub.subscribe(channel)
        except BaseException:
            self._board.remove(slot)
            raise
        if state.missed:
            # A release came while no local waiter listened: try again at once.
            state.missed = 0
            slot.event.set()
        self._channel, self._slot, self._state = channel, slot, state
        waiter = HubWaiter(slot, functools.partial(self._hub.is_ready, channel))
        waiter.listening_since = state.ready_since
        return waiter

    async def __aexit__(self, *exc_info: object) -> None:
        self._hub.leave(self._channel, self._state)
        self._board.remove(self._slot)
