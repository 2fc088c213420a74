"""One owner's place in a lock's line, and its wake-up: a watch on the DELETE of the key just
ahead of its own (etcd's ``waitDeletes``); no deletion after the read that found it is missed
(see :func:`deleted`).  A compaction that overtook the watch, a watch that ends or fails:
the waiter is woken and reads the line again."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import grpc.aio
from etcd3aio import Etcd3Client, WatchFilter

from ..._types import Request, Waiter
from ..._wakeup import Wakeup

log = logging.getLogger("aiodlock.etcd")

_DELETE = 1  # mvccpb.Event.DELETE


async def deleted(client: Etcd3Client, key: bytes, created: int, seen: int, timeout: float) -> bool:
    """Return once ``key`` (made at revision ``created``) is deleted after revision ``seen``
    (True), or once the watch cannot tell (False: compacted, cancelled by the server, failed).

    The watch starts at the current revision, not at ``seen + 1``: etcd serves a watch that
    starts in the past from a loop that catches up every 100 ms (a hand-off waited up to
    that long), a watch from now at once.  What happened between ``seen`` and the watch's
    creation is read instead: once the watch is created, one look at the key tells whether
    it is already gone (or made again since: a newer key, no longer the one).

    The look is taken even when the created reply says nothing changed since ``seen``: etcd
    (3.4) reads the revision a watch starts at before it registers the watch, and a write
    that lands in between (the release this waiter waits for, typically) leaves the watch
    to that 100 ms loop, while the reply still names the revision read first.  Measured:
    about one hand-off in 40 waited 40-100 ms for its event."""
    watch, kv = client.watch, client.kv
    if watch is None or kv is None:
        return False
    try:
        async for reply in watch.watch(key, filters=[WatchFilter.NOPUT]):
            if reply.compact_revision > 0 or reply.canceled:
                return False  # (etcd3aio would jump past the compaction: read again)
            if reply.created:
                found = await kv.get(key, keys_only=True, timeout=timeout)
                if not found.kvs or found.kvs[0].create_revision != created:
                    return True
                continue
            if any(event.type == _DELETE for event in reply.events):
                return True
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the caller reads again (and meets the failure itself)
        log.debug("etcd: the watch on %r failed: %r", key, exc)
    return False


@dataclasses.dataclass(slots=True, eq=False)
class Place:
    """An owner's key in a lock's line, from its first waiting attempt until it is granted
    or abandoned."""

    request: Request
    key: bytes = b""
    lease: int = 0
    revision: int = 0  # the key's create_revision (0: not known)
    #: When the attempt that armed the watch was sent (the waiter hears every release since).
    sent: float | None = None
    event: Wakeup = dataclasses.field(default_factory=Wakeup)
    ahead: bytes | None = None  # the key watched (the newest one older than ours)
    ahead_created: int = 0  # (its create_revision)
    watch: asyncio.Task[None] | None = None
    call: grpc.aio.UnaryUnaryCall[Any, Any] | None = None  # the attempt's txn, until answered

    def forget(self) -> None:
        """Our key is gone (with its lease): the next attempt makes a new one."""
        self.stop()
        self.key, self.lease, self.revision = b"", 0, 0

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        self.ahead = None
        self.sent = None

    def arm(
        self,
        client: Etcd3Client,
        ahead: tuple[bytes, int],
        revision: int,
        sent: float,
        timeout: float,
    ) -> None:
        """Watch ``ahead`` (key, create_revision) for its deletion after ``revision`` (kept
        if it is watched already)."""
        key, created = ahead
        if (
            (self.ahead, self.ahead_created) == ahead
            and self.watch is not None
            and not self.watch.done()
        ):
            return
        self.stop()
        self.ahead, self.ahead_created, self.sent = key, created, sent
        self.watch = asyncio.get_running_loop().create_task(
            self._watch(client, key, created, revision, timeout), name="aiodlock:etcd-watch"
        )

    async def _watch(
        self, client: Etcd3Client, key: bytes, created: int, seen: int, timeout: float
    ) -> None:
        try:
            await deleted(client, key, created, seen, timeout)
        finally:
            if self.watch is asyncio.current_task():
                self.watch = None
                self.ahead = None
                self.sent = None
                self.event.set()


class PlaceWaiter(Waiter):
    """What :func:`~aiodlock._waiting.acquire_loop` sleeps on: the place's watch."""

    __slots__ = ("listening_since", "place")

    def __init__(self, place: Place) -> None:
        self.place = place
        # A watch armed by the first attempt replays every deletion since that attempt's read,
        # and the read saw every one before it: no release since the attempt goes unheard.
        self.listening_since = None if place.sent is None else 0.0

    async def wait(self, timeout: float | None) -> bool:
        event = self.place.event
        await event.wait(timeout)
        if not event.is_set():
            return False
        self.place.event = Wakeup()
        return True

    def listening(self) -> bool:
        # The server's line decides who is next: no local reservation is of any use.
        return False

    def wake(self) -> None:
        self.place.event.set()
