"""``zookeeper://h1:2181,h2:2181/chroot`` (alias ``zk://``): ephemeral sequential nodes.

The algorithm (Curator's InterProcessMutex / kazoo's Lock, see docs/backends/zookeeper.md):

* the lock ``name`` is the node ``{chroot}/{namespace}/locks/{escaped name}`` (a container
  node: the server deletes it once its last child is gone);
* each acquire creates an EPHEMERAL_SEQUENTIAL child ``{escaped owner}#{attempt}#{seq}``;
  the create and a listing of the children go out back to back (one round trip; the
  server runs one session's requests in order, so the listing sees the new node);
* the child with the lowest sequence number holds the lock; every other one sets a watch
  on its immediate predecessor only (no herd) and, when that fires, lists again;
* the owner and a per-attempt id in the child's name let a client find its own node when
  the reply to a create was lost with the connection (protection mode), and let
  :meth:`ZooKeeperBackend.abandon` delete it after a cancellation;
* the fencing token is the child's ``czxid`` (the zxid of its creation: it increases
  across the whole ensemble, so it also increases when the parent was deleted and made
  again, which resets sequence numbers);
* the lease is the client's ONE ZooKeeper session; its nodes vanish when it ends.  The
  backend tracks the session itself (aiozk does not report its loss) and reports lost
  leases through the core's callback.

The session machinery is in :mod:`._session`, names and paths in :mod:`._paths`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import secrets as _secrets
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Self, TypeVar
from urllib.parse import quote

from aiozk import ACL, exc, protocol

from ..._errors import BackendError, BackendTimeout, ConfigurationError, translating
from ..._retry import Guaranteed, retrying
from ..._types import LockStatus
from ..._url import ParsedURL, take_float, take_str
from .._base import (
    Backend,
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LostCallback,
    Request,
    monotonic,
)
from ._paths import basename, escape_segment, order, parse_chroot, unescape_segment
from ._session import (
    EVENT_DATA_CHANGED,
    EVENT_DELETED,
    CreateContainerRequest,
    Disconnected,
    Session,
    SessionEvent,
    WatchCallback,
)

__all__ = ["DEFAULT_PORT", "ZooKeeperBackend"]

log = logging.getLogger("aiodlock.zookeeper")

T = TypeVar("T")

DEFAULT_PORT = 2181

_OPEN_ACL = [protocol.UNRESTRICTED_ACCESS]
ACL_PRESETS: dict[str, list[Any]] = {
    # world:anyone may do anything (ZooKeeper's OPEN_ACL_UNSAFE; kazoo's and Curator's default)
    "open": _OPEN_ACL,
    # only the authenticated creator (digest credentials) may do anything
    "creator": [protocol.AUTHED_UNRESTRICTED],
    # the creator may do anything, anyone may read (so others can see status())
    "creator_read": [protocol.AUTHED_UNRESTRICTED, protocol.WORLD_READABLE],
}
#: Seconds after a grant when the holder's watch on its own node is set (see _arm).
OWN_WATCH_DELAY = 0.05
#: How many ended holder nodes a backend remembers (for handoffs without a listing).
ENDED_MEMORY = 4096
#: How often a create may find its lock node gone (deleted by the container reaper just
#: after it was made again) before giving up.
MAX_PARENT_RETRIES = 10
_EPHEMERAL_SEQUENTIAL = (
    protocol.CreateRequest.EPHEMERAL_FLAG | protocol.CreateRequest.SEQUENTIAL_FLAG
)


@dataclasses.dataclass(slots=True, eq=False)
class _Node:
    """``Grant.data``: the lock node of a grant."""

    path: str
    session_id: int
    watch: WatchCallback | None = None
    arm_timer: asyncio.TimerHandle | None = None
    #: Set when a create of the attempt had a lost reply: the server may still apply it
    #: after the lookup (through another member), so the release sweeps the prefix.
    sweep_prefix: str | None = None


@dataclasses.dataclass(slots=True, eq=False)
class _Attempt:
    """One acquire in progress."""

    request: Request
    parent: str
    prefix: str  # the node name up to the sequence number: "{owner}#{attempt}#"
    event: asyncio.Event
    path: str | None = None
    czxid: int = 0
    session_id: int = 0
    #: The session a create was sent on whose reply was lost (protection mode).
    in_doubt: int | None = None
    #: The local callback of the watch on the attempt's own node while it waits.
    own_cb: WatchCallback | None = None
    #: The server-side watch on the own node is set (and has not fired).
    own_armed: bool = False
    #: The own node was deleted (by someone else, or with the session).
    own_gone: bool = False
    #: A create of this attempt had a lost reply (its node may turn up late).
    had_doubt: bool = False


class _Raced(BackendError):
    """The nodes changed under a look (a lock node reaped, a holder gone): look again."""


class _LeftBehind(BackendTimeout):
    """A node deletion not confirmed in time: the backend's clean-up goes on with it."""


def _raced(error: BackendError) -> bool:
    return isinstance(error, _Raced)


def _reconnectable(error: BackendError) -> bool:
    """The connection was lost: tried again once the session is connected again."""
    return isinstance(error.__cause__, Disconnected)


class ZooKeeperBackend(Backend):
    """Locks as ephemeral sequential nodes, one ZooKeeper session per client."""

    backend_name = "zookeeper"
    capabilities = (
        Capability.FAIR
        | Capability.ALWAYS_FAIR
        | Capability.FENCING
        | Capability.SESSION_LEASE
        | Capability.CROSS_PROCESS
    )

    def __init__(
        self,
        config: CommonConfig,
        *,
        hosts: Sequence[tuple[str, int]] = (("127.0.0.1", DEFAULT_PORT),),
        chroot: str = "",
        session_timeout: float | None = None,
        username: str | None = None,
        password: str | None = None,
        acl: str | Sequence[Any] = "open",
        scheme: str = "zookeeper",
    ) -> None:
        self.config = config
        self.hosts = list(hosts)
        self.chroot = chroot
        #: The session timeout asked for (the server may negotiate another one).
        self.requested_session_timeout = (
            session_timeout if session_timeout is not None else config.watchdog_ttl
        )
        self.username = username
        self._password = password
        self._scheme = scheme
        if isinstance(acl, str):
            if acl not in ACL_PRESETS:
                raise ConfigurationError(
                    f"option 'acl' must be one of {', '.join(ACL_PRESETS)} or a list of "
                    f"aiozk.ACL, got {acl!r}"
                )
            if acl != "open" and username is None:
                raise ConfigurationError(
                    f"acl={acl!r} needs digest credentials (zookeeper://USER:PASSWORD@...)"
                )
            self.acl_name = acl
            self._acl = list(ACL_PRESETS[acl])
        else:
            self.acl_name = "custom"
            self._acl = list(acl)
            if not self._acl or not all(isinstance(item, ACL) for item in self._acl):
                raise ConfigurationError("option 'acl' must be a non-empty list of aiozk.ACL")
        self._auth: list[tuple[str, bytes]] = []
        if username is not None and password is not None:
            self._auth.append(("digest", f"{username}:{password}".encode()))
        self._secrets = (password,) if password else ()
        self._root = f"{chroot}/{escape_segment(config.namespace)}"
        self._locks = f"{self._root}/locks"
        self._session: Session | None = None
        self._on_lost: LostCallback | None = None
        #: Path -> grant, for every lease this backend holds.
        self._grants: dict[str, Grant] = {}
        #: (name, owner) -> the attempt, until it returns or is abandoned.
        self._attempts: dict[tuple[str, str], _Attempt] = {}
        self._active: set[_Attempt] = set()
        #: Node deletions that must happen (made again, for its session, by open()).
        self._cleanup = Guaranteed("zookeeper: delete")
        #: Nodes of this backend's grants that ended lately (path -> None, oldest first).
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closing = False

    # -- configuration -------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        if url.scheme not in ("zookeeper", "zk"):
            raise ConfigurationError(f"not a ZooKeeper URL scheme: {url.scheme!r}")
        hosts = url.host_list(DEFAULT_PORT) or [("127.0.0.1", DEFAULT_PORT)]
        chroot = parse_chroot(url.path)
        username = take_str(options, "username", url.username)
        password = take_str(options, "password", url.password, secret=True)
        if (username is None) != (password is None):
            raise ConfigurationError(
                "ZooKeeper digest authentication needs both a user name and a password "
                "(zookeeper://USER:PASSWORD@host/...)"
            )
        if username is not None and ":" in username:
            raise ConfigurationError("a ZooKeeper digest user name must not contain ':'")
        session_timeout = take_float(
            options, "session_timeout", config.watchdog_ttl, allow_zero=False
        )
        acl = options.pop("acl", "open")
        if not isinstance(acl, str) and not isinstance(acl, list | tuple):
            raise ConfigurationError(
                f"option 'acl' must be one of {', '.join(ACL_PRESETS)} or a list of aiozk.ACL"
            )
        return cls(
            config,
            hosts=hosts,
            chroot=chroot,
            session_timeout=session_timeout,
            username=username,
            password=password,
            acl=acl,
            scheme=url.scheme,
        )

    def describe(self) -> str:
        auth = f"{quote(self.username, safe='')}:***@" if self.username is not None else ""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        return f"{self._scheme}://{auth}{hosts}{quote(self.chroot)}"

    @property
    def session_timeout(self) -> float:
        """The session timeout in force (negotiated with the server once connected)."""
        if self._session is not None and self._session.session_id:
            return self._session.timeout
        return self.requested_session_timeout

    @property
    def session_id(self) -> int:
        """The current ZooKeeper session id (0 when there is none)."""
        return self._session.session_id if self._session is not None else 0

    def lock_path(self, name: str) -> str:
        """The ZooKeeper node of the lock ``name`` (its children are the queue)."""
        return f"{self._locks}/{escape_segment(name)}"

    # -- plumbing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        """The one place where driver exceptions become BackendError / BackendTimeout."""
        with translating(
            "zookeeper",
            (exc.ZKError,),
            (exc.TimeoutError, exc.OperationTimeout),
            what=what,
            secrets=self._secrets,
            transient=(Disconnected,),
        ):
            yield

    @property
    def _zk(self) -> Session:
        if self._session is None or self._closing:
            raise BackendError("zookeeper: the client is not open (or was closed)")
        return self._session

    async def _rt(self, *requests: Any) -> list[Any]:
        """One round trip, bounded by ``op_timeout``."""
        async with asyncio.timeout(self.config.op_timeout):
            return await self._zk.call(*requests)

    async def _list(self, parent: str) -> list[str] | None:
        """The children of ``parent`` (None when it does not exist)."""
        [result] = await self._rt(protocol.GetChildrenRequest(path=parent, watch=False))
        if isinstance(result, exc.NoNode):
            return None
        if isinstance(result, Exception):
            raise result
        children: list[str] = result.children
        return children

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self, on_lost: LostCallback) -> None:
        self._on_lost = on_lost
        self._closing = False
        self._session = Session(
            self.hosts,
            timeout=self.requested_session_timeout,
            connect_timeout=self.config.connect_timeout,
            op_timeout=self.config.op_timeout,
            auth=self._auth,
            on_event=self._on_session_event,
        )
        self._cleanup = Guaranteed(
            "zookeeper: delete", wait_ready=self._session.wait_connected, retry_if=_reconnectable
        )
        with self._translate("connect"):
            await self._session.start()
        if self._session.timeout != self.requested_session_timeout:
            log.info(
                "zookeeper: the server set the session timeout to %g s (asked for %g s)",
                self._session.timeout,
                self.requested_session_timeout,
            )

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        await self._cleanup.aclose()
        # A waiter may have been handed the lock while the client was closing.
        self._lose(list(self._grants.values()), "the client was closed while the lock was held")
        session, self._session = self._session, None
        if session is not None:
            # Closing the session deletes every node it still has, at once.
            await session.close(self.config.op_timeout)
        self._grants.clear()
        self._attempts.clear()
        for attempt in self._active:
            attempt.event.set()

    # -- session events -------------------------------------------------------------------

    def _on_session_event(self, event: SessionEvent, session_id: int) -> None:
        if event is SessionEvent.SUSPENDED:
            return
        if event in (SessionEvent.RESUMED, SessionEvent.NEW_SESSION):
            self._cleanup.kick()  # deletions left to the background: the server is back
        if event in (SessionEvent.PRESUMED_EXPIRED, SessionEvent.EXPIRED):
            lost = [g for g in self._grants.values() if g.data.session_id == session_id]
            if event is SessionEvent.EXPIRED:
                reason = "the ZooKeeper session expired (its lock nodes were deleted)"
            else:
                timeout = self._session.timeout if self._session is not None else 0.0
                reason = (
                    f"no contact with ZooKeeper for the session timeout ({timeout:g} s): "
                    f"the session, and the lock with it, may have expired"
                )
            self._lose(lost, reason)
        # Waiters check their place again (their nodes or watches may be gone).
        for attempt in self._active:
            attempt.event.set()

    def _lose(self, grants: Sequence[Grant], reason: str) -> None:
        for grant in grants:
            self._forget(grant)
        if grants and self._on_lost is not None:
            try:
                self._on_lost(list(grants), reason)
            except Exception:  # pragma: no cover - the core's callback must not raise
                log.exception("zookeeper: the lost-lease callback failed")

    def _forget(self, grant: Grant) -> None:
        node: _Node = grant.data
        if self._grants.get(node.path) is grant:
            del self._grants[node.path]
            # A waiter behind this node will know, when it is deleted, that the lock is
            # its own (a granted node was the lowest: nothing below it can come back).
            self._ended[node.path] = None
            if len(self._ended) > ENDED_MEMORY:
                self._ended.popitem(last=False)
        if node.arm_timer is not None:
            node.arm_timer.cancel()
            node.arm_timer = None
        if node.watch is not None and self._session is not None:
            self._session.unwatch(node.path, node.watch)
            node.watch = None

    # -- the holder's watch on its own node ------------------------------------------------

    def _arm(self, grant: Grant, *, armed: bool) -> None:
        """Watch the holder's node, so that a deletion by anyone else is a lost lease.

        A waiter already set that watch (``armed``).  Otherwise the server-side watch is
        set ``OWN_WATCH_DELAY`` after the grant: most uncontended critical sections are
        shorter, and then cost no extra request and no event.  A node deleted before the
        watch is set is noticed by the reply to the watch request.
        """
        node: _Node = grant.data
        node.watch = functools.partial(self._own_node_event, grant)
        self._zk.watch(node.path, node.watch)
        if not armed:
            node.arm_timer = asyncio.get_running_loop().call_later(
                OWN_WATCH_DELAY, self._send_own_watch, grant
            )

    def _send_own_watch(self, grant: Grant) -> None:
        node: _Node = grant.data
        node.arm_timer = None
        if self._grants.get(node.path) is not grant or self._session is None:
            return
        fut = self._session.send_nowait(protocol.GetDataRequest(path=node.path, watch=True))
        if fut is not None:
            # If this is lost with the connection, the watch is registered again on
            # reconnection (the path stays in the session's watch table).
            fut.add_done_callback(functools.partial(self._own_watch_reply, grant))

    def _own_watch_reply(self, grant: Grant, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), exc.NoNode):
            self._vanished(grant)

    def _own_node_event(self, grant: Grant, event_type: int) -> None:
        if self._grants.get(grant.data.path) is not grant:
            return
        if event_type == EVENT_DATA_CHANGED:
            self._send_own_watch(grant)  # a watch fires once: set it again
            return
        self._vanished(grant)

    def _vanished(self, grant: Grant) -> None:
        node: _Node = grant.data
        if self._grants.get(node.path) is not grant:
            return  # released, or already reported
        if self._session is None or node.session_id != self._session.session_id:
            self._forget(grant)  # its session ended: reported with the session event
            return
        self._lose([grant], "the lock node was deleted by someone else (force_release?)")

    # -- acquire ----------------------------------------------------------------------------

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        grant = await self.acquire(request, monotonic())
        return grant if grant is not None else Busy(None)

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        key = (request.name, request.owner)
        attempt = _Attempt(
            request,
            self.lock_path(request.name),
            f"{escape_segment(request.owner)}#{_secrets.token_hex(4)}#",
            asyncio.Event(),
        )
        # NOTE: kept until the attempt returns; after an exception the core calls
        # abandon(), which needs it to find the node.
        self._attempts[key] = attempt
        self._active.add(attempt)
        try:
            if deadline is not None and monotonic() >= deadline:
                with self._translate("acquire"):
                    grant = await self._try_once(attempt)
            else:
                grant = await self._wait_in_line(attempt, deadline)
        finally:
            self._active.discard(attempt)
            self._unwatch_own(attempt)
        if self._attempts.get(key) is attempt:
            del self._attempts[key]
        return grant

    def _set_path(self, attempt: _Attempt, path: str | None) -> None:
        """Point the attempt at another node (or none), dropping the old node's watch."""
        self._unwatch_own(attempt)
        attempt.path = path
        attempt.own_armed = attempt.own_gone = False

    def _unwatch_own(self, attempt: _Attempt) -> None:
        if attempt.own_cb is not None and attempt.path is not None and self._session is not None:
            self._session.unwatch(attempt.path, attempt.own_cb)
        attempt.own_cb = None

    @staticmethod
    def _own_event_while_waiting(attempt: _Attempt, event_type: int) -> None:
        attempt.own_armed = False  # a watch fires once
        if event_type == EVENT_DELETED:
            attempt.own_gone = True
        attempt.event.set()

    async def _try_once(self, attempt: _Attempt) -> Grant | None:
        """One attempt that never queues: look first, create only when the lock is free."""
        children = await self._list(attempt.parent)
        if children and order(children):
            return None
        queue = order(await self._create(attempt))
        if queue and attempt.path is not None and queue[0].name == basename(attempt.path):
            grant = self._grant(attempt)
            if grant is not None:
                return grant
        await self._give_up(attempt)
        return None

    async def _wait_in_line(self, attempt: _Attempt, deadline: float | None) -> Grant | None:
        """:meth:`_queue`, run again whenever the connection comes back within op_timeout."""
        try:
            return await retrying(
                functools.partial(self._queue, attempt, deadline),
                until=deadline,
                limit=self.config.op_timeout,
                wait_ready=self._zk.wait_connected,
                retry_if=_reconnectable,
                what="zookeeper: acquire",
            )
        except BackendError as error:
            if not _reconnectable(error):
                raise
        with self._translate("acquire"):
            if self._closing:
                raise BackendError("zookeeper: the client was closed")
            if deadline is not None and monotonic() >= deadline:
                await self._give_up(attempt)
                return None
        raise BackendTimeout(
            f"zookeeper: no connection to the servers for {self.config.op_timeout:g} s (op_timeout)"
        )

    async def _queue(self, attempt: _Attempt, deadline: float | None) -> Grant | None:
        """Take a place in the queue and wait for the predecessors to leave."""
        with self._translate("acquire"):
            while True:
                attempt.event.clear()
                if attempt.in_doubt is not None:
                    await self._recover(attempt)
                if attempt.path is None:
                    children: list[str] | None = await self._create(attempt)
                else:
                    children = await self._list(attempt.parent)
                queue = order(children or ())
                mine = basename(attempt.path) if attempt.path is not None else None
                index = next((i for i, c in enumerate(queue) if c.name == mine), None)
                if index is None:
                    # Our node is gone: its session ended, or someone deleted it.
                    self._set_path(attempt, None)
                    continue
                strays = [c for c in queue if c.name != mine and c.name.startswith(attempt.prefix)]
                if strays:
                    # A create of this attempt whose reply was lost and that protection mode
                    # missed (the server applied it late): ahead of us it would block us
                    # for ever, behind us it would hold the lock once we leave.
                    await self._delete_children(attempt.parent, [c.name for c in strays])
                    continue
                if index == 0:
                    grant = self._grant(attempt)
                    if grant is not None:
                        return grant
                    continue
                if deadline is not None and monotonic() >= deadline:
                    await self._give_up(attempt)
                    return None
                predecessor = f"{attempt.parent}/{queue[index - 1].name}"
                if await self._wait_for(attempt, predecessor, index == 1, deadline):
                    # The holder left and nobody can have come in between: no listing.
                    grant = self._grant(attempt)
                    if grant is not None:
                        return grant

    async def _create(self, attempt: _Attempt) -> list[str]:
        """Create the attempt's node and list the queue, in one round trip.

        When the lock node is missing (new, or just reaped) it is made and the create is
        sent again at once, up to MAX_PARENT_RETRIES times.
        """
        return await retrying(
            functools.partial(self._create_once, attempt),
            tries=MAX_PARENT_RETRIES,
            first=0.0,
            retry_if=_raced,
            what="zookeeper: create",
        )

    async def _create_once(self, attempt: _Attempt) -> list[str]:
        zk = self._zk
        if not zk.connected:
            raise Disconnected()
        session_id = zk.session_id
        attempt.in_doubt = session_id
        created, listed = await self._rt(
            protocol.Create2Request(
                path=f"{attempt.parent}/{attempt.prefix}",
                data=b"",
                acl=self._acl,
                flags=_EPHEMERAL_SEQUENTIAL,
            ),
            protocol.GetChildrenRequest(path=attempt.parent, watch=False),
        )
        attempt.in_doubt = None
        if isinstance(created, exc.NoNode):
            await self._make_parents(attempt.parent)
            raise _Raced(
                f"zookeeper: the lock node {attempt.parent!r} vanished while a node was created "
                f"in it (it was made again up to {MAX_PARENT_RETRIES} times)"
            )
        if isinstance(created, Exception):
            raise created
        self._set_path(attempt, created.path)
        attempt.czxid = created.stat.created_zxid
        attempt.session_id = session_id
        if isinstance(listed, Exception):
            raise listed
        children: list[str] = listed.children
        return children

    async def _make_parents(self, parent: str) -> None:
        """Create the lock node and the nodes above it (NodeExists is fine)."""
        chain: list[Any] = []
        prefix = ""
        for segment in self.chroot.split("/")[1:] + self._locks[len(self.chroot) :].split("/")[1:]:
            prefix = f"{prefix}/{segment}"
            chain.append(protocol.Create2Request(path=prefix, data=b"", acl=self._acl, flags=0))
        # The lock node itself is a container: the server deletes it once it is empty.
        chain.append(CreateContainerRequest(path=parent, data=b"", acl=self._acl, flags=0))
        results = await self._rt(*chain)
        last = results[-1]
        if not isinstance(last, Exception) or isinstance(last, exc.NodeExists):
            return
        if isinstance(last, exc.NoNode):
            # A node above could not be made: report why.  (Errors on nodes above that
            # already exist, e.g. NoAuth on a chroot made by an administrator, do not count.)
            for result in results[:-1]:
                if isinstance(result, Exception) and not isinstance(result, exc.NodeExists):
                    raise result
        raise last

    async def _recover(self, attempt: _Attempt) -> None:
        """Protection mode: after a lost create reply, find the node it may have made."""
        session_id, attempt.in_doubt = attempt.in_doubt, None
        if session_id is None or session_id != self._zk.session_id:
            return  # nothing was in doubt, or the node died with its session
        attempt.had_doubt = True
        children = await self._list(attempt.parent)
        mine = [c for c in order(children or ()) if c.name.startswith(attempt.prefix)]
        if not mine:
            return
        await self._delete_children(attempt.parent, [c.name for c in mine[1:]])
        path = f"{attempt.parent}/{mine[0].name}"
        [stat] = await self._rt(protocol.ExistsRequest(path=path, watch=False))
        if isinstance(stat, exc.NoNode):
            return
        if isinstance(stat, Exception):
            raise stat
        self._set_path(attempt, path)
        attempt.czxid = stat.stat.created_zxid
        attempt.session_id = session_id

    async def _wait_for(
        self, attempt: _Attempt, predecessor: str, first_in_line: bool, deadline: float | None
    ) -> bool:
        """Sleep until ``predecessor`` changes, our node or the session does, or ``deadline``.

        Returns True when the lock is ours without listing again: the deleted predecessor
        was the holder, because it was first in our listing (``first_in_line``) or was a
        grant of this backend (then it was the lowest node: nothing below it can come
        back).  Nobody can have come in between: a node created after our listing has a
        higher sequence number than ours.  The watch on our own node (set here, in the
        same round trip) tells if our node went.
        """
        deleted = False
        was_holder = first_in_line

        def on_event(event_type: int) -> None:
            nonlocal deleted, was_holder
            if event_type == EVENT_DELETED:
                deleted = True
                was_holder = was_holder or predecessor in self._ended
            attempt.event.set()

        zk = self._zk
        own = attempt.path
        assert own is not None
        zk.watch(predecessor, on_event)
        # getData rather than exists: on a node that is already gone it sets no watch.
        requests = [protocol.GetDataRequest(path=predecessor, watch=True)]
        arm_own = not attempt.own_armed
        if arm_own:
            if attempt.own_cb is None:
                attempt.own_cb = functools.partial(self._own_event_while_waiting, attempt)
                zk.watch(own, attempt.own_cb)
            requests.append(protocol.GetDataRequest(path=own, watch=True))
        try:
            replies = await self._rt(*requests)
            if arm_own:
                if isinstance(replies[1], exc.NoNode):
                    attempt.own_gone = True
                    return False
                if isinstance(replies[1], Exception):
                    raise replies[1]
                attempt.own_armed = not attempt.own_gone
            reply = replies[0]
            if isinstance(reply, exc.NoNode):
                deleted = True  # gone already
                was_holder = was_holder or predecessor in self._ended
            elif isinstance(reply, Exception):
                raise reply
            else:
                timeout = None if deadline is None else deadline - monotonic()
                if timeout is None or timeout > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(timeout):
                            await attempt.event.wait()
        finally:
            zk.unwatch(predecessor, on_event)
        return deleted and was_holder and not attempt.own_gone

    def _grant(self, attempt: _Attempt) -> Grant | None:
        """The attempt's node is the lowest: the lock is ours (if its session still is)."""
        assert attempt.path is not None
        if not self._zk.usable(attempt.session_id) or attempt.own_gone:
            # The node died (or may have died) with its session, or was deleted.
            self._set_path(attempt, None)
            return None
        request = attempt.request
        node = _Node(attempt.path, attempt.session_id)
        if attempt.had_doubt:
            node.sweep_prefix = attempt.prefix
        grant = Grant(request.name, request.owner, attempt.czxid, None, node)
        self._grants[node.path] = grant
        self._arm(grant, armed=attempt.own_armed)
        self._unwatch_own(attempt)  # the grant's watch callback took over
        return grant

    async def _give_up(self, attempt: _Attempt) -> None:
        """Leave the queue (deadline, or a try-lock that found the lock taken)."""
        with contextlib.suppress(_LeftBehind):  # then the background goes on until done
            await self._leave(attempt, "acquire")

    async def _leave(self, attempt: _Attempt, what: str) -> None:
        """Delete the attempt's node, and its prefix's nodes if a create reply was lost."""
        path = attempt.path
        self._set_path(attempt, None)
        doubt, attempt.in_doubt = attempt.in_doubt, None
        if doubt is not None:
            # A create went out and its reply never came: the node may exist.
            await self._sweep(attempt.parent, attempt.prefix, doubt, what)
        if path is not None:
            await self._remove(path, attempt.session_id, what)

    # -- removing nodes: now, else by the core's guaranteed clean-up -----------------------------

    async def _remove(self, path: str, session_id: int, what: str) -> bool:
        """Delete ``path`` (a node of session ``session_id``) until it or its session is gone.

        Returns whether it was deleted by this call or an earlier unconfirmed try of it.
        Tried through reconnections for ``op_timeout``; after that (or a cancellation) the
        core's clean-up goes on in the background until the node or the session is gone (a
        lock node left behind would block the lock until the session ends: pitfall 7), and
        this raises BackendTimeout.
        """
        action = self._deletion(path, session_id, what)
        return await self._clean_up((path, ""), action, "delete a lock node")

    def _deletion(self, path: str, session_id: int, what: str) -> Callable[[], Awaitable[bool]]:
        zk = self._zk
        sent = False

        async def delete() -> bool:
            nonlocal sent
            with self._translate(what):
                if zk.session_id != session_id:
                    return sent  # the node ended with its session
                if not zk.connected:
                    raise Disconnected()
                try:
                    [result] = await self._rt(protocol.DeleteRequest(path=path, version=-1))
                except Disconnected:
                    sent = True
                    raise
                if isinstance(result, exc.NoNode):
                    # Already gone: it was ours only if an earlier, unconfirmed try deleted it.
                    return sent
                if isinstance(result, Exception):
                    raise result
                return True

        return delete

    async def _sweep(self, parent: str, prefix: str, session_id: int, what: str) -> None:
        """Delete every child of ``parent`` whose name starts with ``prefix`` (as _remove)."""
        zk = self._zk

        async def sweep() -> None:
            with self._translate(what):
                if zk.session_id == session_id:
                    children = await self._list(parent)
                    await self._delete_children(
                        parent, [c for c in children or () if c.startswith(prefix)]
                    )

        await self._clean_up((parent, prefix), sweep, "clean up a lock attempt")

    async def _clean_up(
        self, key: tuple[str, str], action: Callable[[], Awaitable[T]], what: str
    ) -> T:
        try:
            return await self._cleanup.run(key, action, until=monotonic() + self.config.op_timeout)
        except BackendError as error:
            if not _reconnectable(error):
                raise
        raise _LeftBehind(
            f"zookeeper: could not {what} within {self.config.op_timeout:g} s; it is retried "
            f"in the background until it or its session is gone"
        )

    async def _delete_children(self, parent: str, names: Sequence[str]) -> None:
        if not names:
            return
        results = await self._rt(
            *(protocol.DeleteRequest(path=f"{parent}/{name}", version=-1) for name in names)
        )
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, exc.NoNode):
                raise result

    # -- release, renew, abandon ------------------------------------------------------------

    async def release(self, grant: Grant) -> bool:
        node: _Node = grant.data
        self._forget(grant)  # from now on a deletion of the node is no loss
        zk = self._zk
        if zk.session_id != node.session_id:
            return False  # the node ended with its session
        if zk.presumed_dead:
            # The lease was already reported lost; do not hold the caller up while the
            # servers are unreachable: delete the node once (if ever) they answer again.
            self._cleanup.later(
                (node.path, ""), self._deletion(node.path, node.session_id, "release")
            )
            return False
        with self._translate("release"):
            deleted = await self._remove(node.path, node.session_id, "release")
            if node.sweep_prefix is not None:
                parent = node.path.rpartition("/")[0]
                with contextlib.suppress(_LeftBehind):  # then it goes on in the background
                    await self._sweep(parent, node.sweep_prefix, node.session_id, "release")
        return deleted

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        """Check that each node still exists in this session (the session is the lease)."""
        started = monotonic()
        with self._translate("renew"):
            replies = await self._rt(
                *(protocol.ExistsRequest(path=g.data.path, watch=False) for g in grants)
            )
        zk = self._zk
        results: list[float | None] = []
        for grant, reply in zip(grants, replies, strict=True):
            node: _Node = grant.data
            if isinstance(reply, exc.NoNode):
                results.append(None)
                continue
            if isinstance(reply, Exception):
                with self._translate("renew"):
                    raise reply
            alive = (
                reply.stat.ephemeral_owner == node.session_id
                and zk.usable(node.session_id)
                and self._grants.get(node.path) is grant
            )
            results.append(started + ttl if alive else None)
        return results

    async def abandon(self, request: Request) -> None:
        attempt = self._attempts.pop((request.name, request.owner), None)
        if self._closing or self._session is None:
            return  # closing the session deleted its nodes
        with self._translate("abandon"):
            if attempt is not None:
                await self._leave(attempt, "abandon")
            else:
                prefix = f"{escape_segment(request.owner)}#"
                parent = self.lock_path(request.name)
                await self._sweep(parent, prefix, self._zk.session_id, "abandon")

    # -- status, force_release ----------------------------------------------------------------

    async def status(self, name: str) -> LockStatus | None:
        try:
            return await retrying(
                functools.partial(self._status_once, name),
                tries=5,
                first=0.0,
                retry_if=_raced,
                what="zookeeper: status",
            )
        except _Raced:
            return None  # the holder changed under every look

    async def _status_once(self, name: str) -> LockStatus | None:
        parent = self.lock_path(name)
        with self._translate("status"):
            queue = order(await self._list(parent) or ())
            if not queue:
                return None
            holder = queue[0]
            [reply] = await self._rt(
                protocol.ExistsRequest(path=f"{parent}/{holder.name}", watch=False)
            )
            if isinstance(reply, exc.NoNode):
                raise _Raced("zookeeper: the holder left while status() looked")
            if isinstance(reply, Exception):
                raise reply
            return LockStatus(
                name, unescape_segment(holder.owner), reply.stat.created_zxid, None, len(queue) - 1
            )

    async def force_release(self, name: str) -> bool:
        parent = self.lock_path(name)
        with self._translate("force_release"):
            queue = order(await self._list(parent) or ())
            if not queue:
                return False
            [reply] = await self._rt(
                protocol.DeleteRequest(path=f"{parent}/{queue[0].name}", version=-1)
            )
            if isinstance(reply, exc.NoNode):
                return False
            if isinstance(reply, Exception):
                raise reply
            return True
