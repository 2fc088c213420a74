"""``etcd://h1:2379,h2:2379`` (``etcds://``: TLS): the protocol of etcd's concurrency Mutex.

One lease per client (:mod:`._session`).  An attempt is ONE transaction (:mod:`._kv`): if
my key (:mod:`._keys`) has create_revision 0, put it with the lease and read the two newest
keys of the lock's prefix (mine, and the one just ahead if any); else read the newest key
older than mine.  The lock is held when no key is older than mine; a waiter watches the key
just ahead for its DELETE (:mod:`._queue`) and asks again.  Release deletes my key only while
its create_revision is the one granted.  The token is that create_revision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Self
from urllib.parse import quote

from ..._errors import BackendError, ConfigurationError
from ..._retry import Guaranteed
from ..._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LockStatus,
    LostCallback,
    Request,
    Waiter,
    monotonic,
)
from ..._url import ParsedURL, format_host, take_str
from ..._wakeup import Wakeup
from .._base import Backend
from . import _kv as kv
from ._attempts import Attempts, LeaseErrors
from ._keys import Keys
from ._queue import Place, PlaceWaiter, deleted
from ._session import Session, tls_options
from ._txn import Held, LeaseGone

DEFAULT_PORT = 2379
#: Seconds after a grant when the holder's watch on its own key is made.
OWN_WATCH_DELAY = 0.05
#: How often the holder's watch is made again after it ended without telling.
OWN_WATCH_TRIES = 3
SSL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


class EtcdBackend(Backend):
    """Locks as keys of one client lease, queued by create_revision."""

    backend_name = "etcd"
    capabilities = (
        Capability.FAIR
        | Capability.ALWAYS_FAIR
        | Capability.FENCING
        | Capability.SESSION_LEASE
        | Capability.CROSS_PROCESS
    )

    def __init__(self, config: CommonConfig, url: ParsedURL, options: dict[str, Any]) -> None:
        if url.scheme not in ("etcd", "etcds"):
            raise ConfigurationError(f"not an etcd URL scheme: {url.scheme!r}")
        if url.path not in ("", "/"):
            raise ConfigurationError(
                f"an etcd URL takes no path (got {url.path!r}); use the namespace option"
            )
        self.config = config
        self._scheme = url.scheme
        self.hosts = url.host_list(DEFAULT_PORT) or [("127.0.0.1", DEFAULT_PORT)]
        self.username = take_str(options, "username", url.username)
        password = take_str(options, "password", url.password)
        if (self.username is None) != (password is None):
            raise ConfigurationError(
                "etcd authentication needs both a user name and a password "
                "(etcd://USER:PASSWORD@host:2379)"
            )
        self._credentials = None if password is None else (str(self.username), password)
        files = {name: take_str(options, name, None) for name in SSL_FILES}
        self._tls = tls_options(files) if url.scheme == "etcds" else None
        if url.scheme == "etcd" and any(files.values()):
            raise ConfigurationError("ssl_* options need the etcds:// scheme")
        self.keys = Keys(config.namespace)
        self.session: Session | None = None
        self._on_lost: LostCallback | None = None
        self._cleanup: Guaranteed | None = None
        self._places: dict[tuple[str, str], Place] = {}
        self._grants: dict[bytes, Grant] = {}
        #: The keys of this client's places and grants, and of deletes not yet done: a slot
        #: (see :mod:`._keys`) is taken again only once its key is known to be gone.
        self._taken: set[bytes] = set()
        self._attempts = Attempts()

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(config, url, options)

    def describe(self) -> str:
        auth = f"{quote(self.username, safe='')}:***@" if self.username is not None else ""
        servers = ",".join(format_host(h, p) for h, p in self.hosts)
        return f"{self._scheme}://{auth}{servers}"

    @property
    def _io(self) -> Session:
        if self.session is None or self.session.closed:
            raise BackendError("etcd: the client is not open (or was closed)")
        return self.session

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self, on_lost: LostCallback) -> None:
        self._on_lost = on_lost
        self._cleanup = Guaranteed("etcd: delete")
        self.session = Session(
            self.hosts,
            self.config,
            tls=self._tls,
            credentials=self._credentials,
            on_lost=self._lease_lost,
            on_back=self._cleanup.kick,
        )
        try:
            await self.session.start()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        for place in self._places.values():
            place.stop()
            place.event.set()
        self._places.clear()
        self._taken.clear()
        if self._cleanup is not None:
            await self._cleanup.aclose()
        grants, self._grants = list(self._grants.values()), {}
        for grant in grants:
            grant.data.stop()
        if grants and self._on_lost is not None:
            self._on_lost(grants, "the client was closed while the lock was held")
        session, self.session = self.session, None
        if session is not None:
            await session.close()  # the lease is revoked: the server deletes its keys at once

    def _lease_lost(self, lease: int, reason: str) -> None:
        lost = [g for g in self._grants.values() if g.data.lease == lease]
        for grant in lost:
            del self._grants[grant.data.key]
            grant.data.stop()
            self._free(grant.data.key)
        if lost and self._on_lost is not None:
            self._on_lost(lost, reason)
        for place in self._places.values():
            if place.lease == lease:
                key = place.key
                place.forget()
                place.event.set()
                self._free(key)
        session = self.session
        if session is not None and self._cleanup is not None:
            self._cleanup.later(("revoke", lease), lambda: session.revoke(lease))

    # -- acquiring -------------------------------------------------------------------------------

    async def try_acquire(
        self, request: Request, *, will_wait: bool, again: bool = True
    ) -> Grant | Busy:
        session = self._io
        ident = (request.name, request.owner)
        place = self._places.get(ident)
        if place is None:
            place = self._places[ident] = Place(request)
        lease = session.lease or await session.current()
        place.event = Wakeup()  # what this read sees needs no wake-up
        if place.lease and place.lease != lease:
            gone = place.key
            place.forget()  # its key went with its lease
            self._free(gone)
        prefix = self.keys.prefix(request.name)
        if not place.key:
            place.key, place.lease, place.revision = self._take_key(prefix, lease), lease, 0
        key = place.key
        known = place.revision
        attempt = self._attempts.request(prefix, key, request.owner, lease, known, will_wait)
        sent = monotonic()
        # NOTE: a cancelled attempt's call runs on (it may reach the server after a clean-up
        # sent later on another stream): abandon() waits for its answer before deleting.
        call = place.call = session.kv.txn(attempt, self.config.op_timeout)
        try:
            with self._lease_errors(lease, "acquire"):
                await kv.answered(call)
                reply = await call
        except LeaseGone:
            if not again:
                raise
            # Found out by this attempt: the next one puts on a fresh lease.
            return await self.try_acquire(request, will_wait=will_wait, again=False)
        place.call = None
        ahead: tuple[bytes, int] | None = None
        seen = reply.revision
        if not reply.succeeded and will_wait:
            reply = reply.txn(0)  # (the nested transaction: the line was not empty)
            if reply.succeeded:  # put behind the newest key
                older = [x for x in reply.range(1).kvs if x.key != key]
                ahead = (older[0].key, older[0].create_revision) if older else None
        if reply.succeeded:
            revision = place.revision = seen  # (the put's revision)
        else:
            found = reply.range(0).kvs
            if not found:
                del self._places[ident]
                self._free(key)
                return Busy(None)  # a try-lock on a taken lock: nothing was put
            revision = place.revision = found[0].create_revision
            if not will_wait:
                oldest = reply.range(1).kvs
                if not oldest or oldest[0].key != key:  # (a key of an earlier, unanswered
                    del self._places[ident]  # try of this acquire)
                    await self._delete(key, revision, "acquire")
                    return Busy(None)
            elif known == revision:
                older = reply.range(1).kvs
                ahead = (older[0].key, older[0].create_revision) if older else None
            else:  # (the put of an attempt whose answer was lost: look, then ask again)
                with self._lease_errors(lease, "acquire"):
                    ahead, seen = await self._before(prefix, revision)
                if ahead is None:
                    request.queued = True
                    place.event.set()
                    return Busy(None)
        if ahead is None:
            del self._places[ident]
            place.stop()
            held = Held(key, revision, lease)
            grant = Grant(request.name, request.owner, revision, None, held)
            self._grants[key] = grant
            # A short hold needs no watch of its own (most end before it would be made).
            held.watch = asyncio.get_running_loop().call_later(
                OWN_WATCH_DELAY, self._watch_own, grant, seen
            )
            return grant
        request.queued = True
        place.arm(session.io, ahead, seen, sent, self.config.op_timeout)
        return Busy(None)

    def _watch_own(self, grant: Grant, revision: int) -> None:
        held: Held = grant.data
        if self._grants.get(held.key) is grant and self.session is not None:
            held.watch = asyncio.get_running_loop().create_task(
                self._own(grant, revision), name="aiodlock:etcd-own-watch"
            )

    async def _own(self, grant: Grant, revision: int) -> None:
        """Report the loss of a held key deleted by someone else."""
        held: Held = grant.data
        session = self._io
        for _ in range(OWN_WATCH_TRIES):
            gone = deleted(session.io, held.key, held.revision, revision, self.config.op_timeout)
            if await gone:
                break
            # The watch could not tell (compacted past its start, refused, failed): look.
            try:
                with session.translate("watch"):
                    reply = await self._txn([], [kv.get(held.key, keys_only=True)])
            except BackendError:
                return  # (a failing server: the lease's deadline decides, the release checks)
            found = reply.range(0).kvs
            if not found or found[0].create_revision != held.revision:
                break
            revision = reply.revision
        else:
            return  # (the release finds out)
        if self._grants.get(held.key) is grant and held.lease == session.lease:
            del self._grants[held.key]
            held.watch = None
            self._free(held.key)
            if self._on_lost is not None:
                self._on_lost([grant], "the lock key was deleted by someone else")

    async def _before(self, prefix: bytes, revision: int) -> tuple[tuple[bytes, int] | None, int]:
        """The newest key of the line created before ``revision`` now (and its
        create_revision), and the revision read at (a waiter's watch looks at what changed
        since)."""
        reply = await self._txn([], [kv.line(prefix, newest=True, below=revision - 1)])
        kvs = reply.range(0).kvs
        return ((kvs[0].key, kvs[0].create_revision) if kvs else None), reply.revision

    def _take_key(self, prefix: bytes, lease: int) -> bytes:
        """The key of this client's first free slot in the line of ``prefix``."""
        slot = 0
        while (key := self.keys.key(prefix, lease, slot)) in self._taken:
            slot += 1
        self._taken.add(key)
        return key

    def _free(self, key: bytes) -> None:
        """``key`` is gone (deleted, or never put, or gone with its lease): its slot may be
        taken again, unless a grant or a place of this client still has it."""
        if key in self._grants or any(p.key == key for p in self._places.values()):
            return
        self._taken.discard(key)

    async def _txn(self, compare: list[bytes], success: list[bytes]) -> kv.Txn:
        reply: kv.Txn = await self._io.kv.txn(kv.txn(compare, success), self.config.op_timeout)
        return reply

    def waiter(self, request: Request) -> AbstractAsyncContextManager[Waiter]:
        key = (request.name, request.owner)
        place = self._places.get(key)
        if place is None:
            place = self._places[key] = Place(request)
        return contextlib.nullcontext(PlaceWaiter(place))

    def _lease_errors(self, lease: int, what: str) -> AbstractContextManager[None]:
        """Translate; a put on a lease the server no longer knows is its loss (detected)."""
        return LeaseErrors(self._io, lease, what)

    # -- releasing -------------------------------------------------------------------------------

    async def release(self, grant: Grant) -> bool:
        held: Held = grant.data
        self._grants.pop(held.key, None)
        held.stop()
        return bool(await self._delete(held.key, held.revision, "release"))

    async def _delete(self, key: bytes, revision: int, what: str) -> bool:
        """Delete ``key`` if its create_revision is ``revision`` (0: whatever it is); what
        cannot be done within ``op_timeout`` is done in the background."""
        session = self._io
        assert self._cleanup is not None

        async def delete() -> bool:
            request = kv.drop(key, revision) if revision else kv.txn([], [kv.delete(key)])
            with session.translate(what):
                reply: kv.Txn = await session.kv.txn(request, self.config.op_timeout)
            self._free(key)
            # (with the compare: it held, so the key was there and is deleted)
            return reply.succeeded and bool(revision or reply.responses[0])

        until = monotonic() + self.config.op_timeout
        try:  # (the common case, without the retry loop's frames)
            return await delete()
        except asyncio.CancelledError:
            self._cleanup.later((key, revision), delete)
            raise
        except Exception:
            if monotonic() >= until:
                self._cleanup.later((key, revision), delete)
                raise
        return await self._cleanup.run((key, revision), delete, until=until)

    async def abandon(self, request: Request) -> None:
        place = self._places.pop((request.name, request.owner), None)
        if place is None:
            # Nothing in flight; a grant the core did not take (the client closed as the
            # answer came) is released.
            for grant in list(self._grants.values()):
                if (grant.name, grant.owner) == (request.name, request.owner):
                    await self.release(grant)
            return
        place.stop()
        if place.call is not None:  # an attempt cut short: its put must not land later
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(kv.answered(place.call), self.config.op_timeout)
        session = self.session
        if session is not None and not session.closed and place.key:
            # (the key is this acquisition's own: deleting it unconditionally, later if
            # need be, can never touch another acquisition's key)
            await self._delete(place.key, place.revision, "abandon")

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        """(only ``extend()``: the lease is kept alive by the session) Is each key still ours?"""
        session = self._io
        started = monotonic()
        with session.translate("renew"):
            reply = await self._txn([], [kv.get(g.data.key, keys_only=True) for g in grants])
        results: list[float | None] = []
        for index, grant in enumerate(grants):
            kvs = reply.range(index).kvs
            ok = bool(kvs) and kvs[0].create_revision == grant.data.revision
            ok = ok and grant.data.lease == session.lease
            results.append(started + ttl if ok else None)
        return results

    # -- looking ---------------------------------------------------------------------------------

    async def _line(self, name: str) -> tuple[kv.KeyValue | None, int]:
        """The holder's key-value (or None) and how many keys the line has."""
        prefix = self.keys.prefix(name)
        end = kv.prefix_end(prefix)
        head = kv.get(prefix, range_end=end, limit=1, order=kv.ASCEND)
        count = kv.get(prefix, range_end=end, count_only=True)
        with self._io.translate("status"):
            reply = await self._txn([], [head, count])
        kvs = reply.range(0).kvs
        return (kvs[0] if kvs else None), reply.range(1).count

    async def status(self, name: str) -> LockStatus | None:
        holder, count = await self._line(name)
        if holder is None:
            return None
        session = self._io
        client = session.io
        assert client.lease is not None
        with session.translate("status"):
            ttl = await client.lease.time_to_live(holder.lease, timeout=self.config.op_timeout)
        left = float(ttl.TTL) if ttl.TTL >= 0 else 0.0
        owner = bytes(holder.value).decode("utf-8", "surrogatepass")
        return LockStatus(name, owner, holder.create_revision, left, count - 1)

    async def force_release(self, name: str) -> bool:
        holder, _ = await self._line(name)
        if holder is None:
            return False
        return await self._delete(holder.key, holder.create_revision, "force_release")
