"""``zookeeper://h1:2181,h2:2181/chroot`` (alias ``zk://``): Curator's InterProcessMutex.

A lock is the container node ``{chroot}/{namespace}/locks/{escaped name}``; each acquire
creates an EPHEMERAL_SEQUENTIAL child ``{escaped owner}#{attempt}#{seq}`` and lists the
children in the same round trip; the lowest holds the lock, each other one watches its
predecessor only (no herd).  The owner and attempt in the name find a node whose create
reply was lost (protection mode).  The token is the child's ``czxid``; the lease is the
client's ONE session (:mod:`._session`).  See docs/backends/zookeeper.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import secrets as _secrets
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import quote

from aiozk import ACL, exc, protocol

from ..._errors import BackendError, BackendTimeout, ConfigurationError
from ..._retry import retrying
from ..._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LockStatus,
    LostCallback,
    Request,
    monotonic,
)
from ..._url import ParsedURL, format_host, take_float, take_str
from ..._wakeup import Wakeup
from .._base import Backend
from ._nodes import LeftBehind, Nodes, Raced, found, reconnectable, translate
from ._paths import Child, escape_segment, order, parse_chroot, unescape_segment
from ._session import EVENT_DELETED, Disconnected, Session, WatchCallback

log = logging.getLogger("aiodlock.zookeeper")

DEFAULT_PORT = 2181
ACL_PRESETS: dict[str, list[Any]] = {
    # world:anyone may do anything (ZooKeeper's OPEN_ACL_UNSAFE; kazoo's and Curator's default)
    "open": [protocol.UNRESTRICTED_ACCESS],
    # only the authenticated creator (digest credentials) may do anything
    "creator": [protocol.AUTHED_UNRESTRICTED],
    # the creator may do anything, anyone may read (so others can see status())
    "creator_read": [protocol.AUTHED_UNRESTRICTED, protocol.WORLD_READABLE],
}
#: How often a create may find its lock node gone (deleted by the container reaper just
#: after it was made again) before giving up.
MAX_PARENT_RETRIES = 10
#: Seconds after an uncontended grant when the holder's watch on its own node is set.
OWN_WATCH_DELAY = 0.05
#: How many ended holder nodes a backend remembers (for handoffs without a listing).
ENDED_MEMORY = 4096
_EPHEMERAL_SEQUENTIAL = (
    protocol.CreateRequest.EPHEMERAL_FLAG | protocol.CreateRequest.SEQUENTIAL_FLAG
)


@dataclasses.dataclass(slots=True, eq=False)
class Node:
    """A lock node of this client: an attempt's, then its grant's (``Grant.data``), watched
    from its create to its end (a deletion re-queues a waiter and is a holder's loss)."""

    path: str
    session_id: int
    czxid: int
    watch: WatchCallback | None = None
    grant: Grant | None = None
    armed: bool = False  # the server-side watch was sent (and has not fired)
    gone: bool = False  # deleted, by someone or with its session
    #: A create of the attempt had a lost reply: the server may still apply it after the
    #: lookup (through another member), so the release sweeps the prefix.
    sweep_prefix: str | None = None


@dataclasses.dataclass(slots=True, eq=False)
class _Attempt:
    """One acquire in progress."""

    request: Request
    parent: str
    prefix: str  # the node name up to the sequence number: "{owner}#{attempt}#"
    event: Wakeup = dataclasses.field(default_factory=Wakeup)
    node: Node | None = None
    in_doubt: int | None = None  # the session of a create whose reply is still unknown
    had_doubt: bool = False  # a create had a lost reply (its node may turn up late)


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

    def __init__(self, config: CommonConfig, url: ParsedURL, options: dict[str, Any]) -> None:
        if url.scheme not in ("zookeeper", "zk"):
            raise ConfigurationError(f"not a ZooKeeper URL scheme: {url.scheme!r}")
        self.config = config
        self._scheme = url.scheme
        self.hosts = url.host_list(DEFAULT_PORT) or [("127.0.0.1", DEFAULT_PORT)]
        self.chroot = parse_chroot(url.path)
        self.username = take_str(options, "username", url.username)
        password = take_str(options, "password", url.password)
        if (self.username is None) != (password is None):
            raise ConfigurationError(
                "ZooKeeper digest authentication needs both a user name and a password "
                "(zookeeper://USER:PASSWORD@host/...)"
            )
        if self.username is not None and ":" in self.username:
            raise ConfigurationError("a ZooKeeper digest user name must not contain ':'")
        timeout = take_float(options, "session_timeout", None, allow_zero=False)
        self.requested_session_timeout = timeout or config.watchdog_ttl  # (the server's may differ)
        self.acl_name, self.acl = _acl(options.pop("acl", "open"), self.username)
        #: The ``addAuth`` credentials sent on every connection.
        self.auth = [] if password is None else [("digest", f"{self.username}:{password}".encode())]
        self._secrets = (password,) if password else ()
        self._locks = f"{self.chroot}/{escape_segment(config.namespace)}/locks"
        self.session: Session | None = None
        self._nodes: Nodes | None = None
        self._on_lost: LostCallback | None = None
        #: (name, owner) -> the attempt, until it returns or is abandoned.
        self._attempts: dict[tuple[str, str], _Attempt] = {}
        #: Node path -> the grant, for every lease held.
        self._grants: dict[str, Grant] = {}
        #: Nodes of this backend's grants that ended lately (path -> None, oldest first): a
        #: waiter right behind one knows, when it is deleted, that the lock is its own (a
        #: granted node was the lowest: nothing below it can come back), without a listing.
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closing = False

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(config, url, options)

    def describe(self) -> str:
        auth = f"{quote(self.username, safe='')}:***@" if self.username is not None else ""
        servers = ",".join(format_host(h, p) for h, p in self.hosts)
        return f"{self._scheme}://{auth}{servers}{quote(self.chroot)}"

    @property
    def session_timeout(self) -> float:
        """The session timeout in force (negotiated with the server once connected)."""
        if self.session is not None and self.session.session_id:
            return self.session.timeout
        return self.requested_session_timeout

    @property
    def session_id(self) -> int:
        """The current ZooKeeper session id (0 when there is none)."""
        return self.session.session_id if self.session is not None else 0

    def lock_path(self, name: str) -> str:
        """The ZooKeeper node of the lock ``name`` (its children are the queue)."""
        return f"{self._locks}/{escape_segment(name)}"

    def _translate(self, what: str) -> contextlib.AbstractContextManager[None]:
        return translate(what, self._secrets)

    @property
    def _io(self) -> Nodes:
        if self._nodes is None or self._closing:
            raise BackendError("zookeeper: the client is not open (or was closed)")
        return self._nodes

    async def open(self, on_lost: LostCallback) -> None:
        self._on_lost = on_lost
        self._closing = False
        self.session = session = Session(
            self.hosts,
            self.requested_session_timeout,
            self.config,
            self.auth,
            self._on_session_event,
        )
        self._nodes = Nodes(session, self._locks, self.acl, self._secrets)
        with self._translate("connect"):
            await session.start()
        if session.timeout != self.requested_session_timeout:
            log.info(
                "zookeeper: the server set the session timeout to %g s (asked for %g s)",
                session.timeout,
                self.requested_session_timeout,
            )

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._nodes is not None:
            await self._nodes.aclose()
        # A waiter may have been handed the lock while the client was closing.
        self._lose(list(self._grants.values()), "the client was closed while the lock was held")
        session, self.session = self.session, None
        if session is not None:
            await session.close()  # the server deletes its nodes at once
        self._wake_attempts()
        self._attempts.clear()

    def _wake_attempts(self) -> None:
        """Waiters check their place again (their nodes or watches may be gone)."""
        for attempt in self._attempts.values():
            attempt.event.set()

    def _on_session_event(self, session_id: int, lost: str | None) -> None:
        if lost is not None:
            self._lose([g for g in self._grants.values() if g.data.session_id == session_id], lost)
        elif self._nodes is not None:
            self._nodes.cleanup.kick()  # deletions left to the background: go on now
        self._wake_attempts()

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        grant = await self.acquire(request, monotonic())
        return grant if grant is not None else Busy(None)

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        key = (request.name, request.owner)
        prefix = f"{escape_segment(request.owner)}#{_secrets.token_hex(4)}#"
        attempt = _Attempt(request, self.lock_path(request.name), prefix)
        # Kept until the attempt returns: after an exception, abandon() needs it.
        self._attempts[key] = attempt
        try:
            if not _passed(deadline):
                grant = await self._wait_in_line(attempt, deadline)
            else:  # a try-lock: it looks first, and creates nothing on a taken lock
                with self._translate("acquire"):
                    taken = bool(await self._io.queue(attempt.parent))
                grant = None if taken else await self._queue(attempt, deadline)
            if grant is None:  # the deadline passed: leave the queue (if in it)
                with self._translate("acquire"), contextlib.suppress(LeftBehind):
                    await self._leave(attempt, "acquire")  # (LeftBehind: it goes on later)
        finally:
            self._unwatch(attempt.node)  # abandon() may still need the node
        if self._attempts.get(key) is attempt:
            del self._attempts[key]
        return grant

    def _set_node(self, attempt: _Attempt, node: Node | None) -> None:
        """Point the attempt at another node of its own (or none), and watch it."""
        self._unwatch(attempt.node)
        attempt.node = node
        if node is not None and self.session is not None:
            node.watch = functools.partial(self._own_event, attempt, node)
            self.session.watch(node.path, node.watch)

    def _unwatch(self, node: Node | None) -> None:
        if node is not None and node.watch is not None:
            if self.session is not None:
                self.session.unwatch(node.path, node.watch)
            node.watch = None

    def _own_event(self, attempt: _Attempt, node: Node, event_type: int) -> None:
        """The watch on a node of ours fired: its waiter looks again; its holder, if the
        node was deleted by someone else, has lost the lock."""
        node.armed = False  # a watch fires once
        node.gone = node.gone or event_type == EVENT_DELETED
        grant = node.grant
        if grant is None:
            attempt.event.set()
        elif not node.gone:
            self._arm(node)  # the data changed: set the watch again
        elif self._grants.get(node.path) is not grant:
            return  # released, or already reported
        elif self.session is None or node.session_id != self.session.session_id:
            self._forget(grant)  # its session ended: reported with the session event
        else:
            self._lose([grant], "the lock node was deleted by someone else (force_release?)")

    async def _wait_in_line(self, attempt: _Attempt, deadline: float | None) -> Grant | None:
        """:meth:`_queue`, run again whenever the connection comes back within op_timeout."""
        try:
            return await retrying(
                functools.partial(self._queue, attempt, deadline),
                until=deadline,
                limit=self.config.op_timeout,
                wait_ready=self._io.session.wait_connected,
                retry_if=reconnectable,
                what="zookeeper: acquire",
            )
        except BackendError as error:
            if not reconnectable(error):
                raise
        if self._closing:
            raise BackendError("zookeeper: the client was closed")
        if _passed(deadline):
            return None
        raise BackendTimeout(
            f"zookeeper: no connection to the servers for {self.config.op_timeout:g} s (op_timeout)"
        )

    async def _queue(self, attempt: _Attempt, deadline: float | None) -> Grant | None:
        """Take a place in the queue and wait for the predecessors to leave."""
        with self._translate("acquire"):
            while True:
                attempt.event = Wakeup()
                if attempt.in_doubt is not None:
                    await self._recover(attempt)
                queue = await (
                    self._io.queue(attempt.parent) if attempt.node else self._create(attempt)
                )
                mine = attempt.node.path.rpartition("/")[2] if attempt.node is not None else None
                index = next((i for i, c in enumerate(queue) if c.name == mine), None)
                if index is None:
                    # Our node is gone: its session ended, or someone deleted it.
                    self._set_node(attempt, None)
                    continue
                strays = [c for c in queue if c.name != mine and c.name.startswith(attempt.prefix)]
                if strays:
                    # A lost-reply create of ours that protection mode missed (applied late):
                    # ahead it would block us for ever, behind it would hold the lock once we left.
                    await self._io.delete_children(attempt.parent, [c.name for c in strays])
                    continue
                if index > 0:
                    if _passed(deadline):
                        return None
                    predecessor = f"{attempt.parent}/{queue[index - 1].name}"
                    if not await self._wait_for(attempt, predecessor, index == 1, deadline):
                        continue
                    # The holder left and nobody can have come in between: no listing.
                grant = self._grant(attempt)
                if grant is not None:
                    return grant

    async def _create(self, attempt: _Attempt) -> list[Child]:
        """Create the attempt's node and list the queue, in one round trip; when the lock
        node is missing (new, or just reaped), make it and create again at once."""
        for _ in range(MAX_PARENT_RETRIES):
            zk = self._io.session
            if not zk.connected:
                raise Disconnected()
            attempt.in_doubt = session_id = zk.session_id
            created, listed = await self._io.call(
                protocol.Create2Request(
                    path=f"{attempt.parent}/{attempt.prefix}",
                    data=b"",
                    acl=self.acl,
                    flags=_EPHEMERAL_SEQUENTIAL,
                ),
                protocol.GetChildrenRequest(path=attempt.parent, watch=False),
            )
            attempt.in_doubt = None
            if not isinstance(created, exc.NoNode):
                break
            await self._io.make_parents(attempt.parent)
        else:
            raise Raced(
                f"zookeeper: the lock node {attempt.parent!r} vanished while a node was created "
                f"in it (it was made again up to {MAX_PARENT_RETRIES} times)"
            )
        if isinstance(created, Exception):
            raise created
        self._set_node(attempt, Node(created.path, session_id, created.stat.created_zxid))
        if isinstance(listed, Exception):
            raise listed
        return order(listed.children)

    async def _recover(self, attempt: _Attempt) -> None:
        """Protection mode: after a lost create reply, find the node it may have made."""
        session_id, attempt.in_doubt = attempt.in_doubt, None
        if session_id is None or session_id != self._io.session.session_id:
            return  # nothing was in doubt, or the node died with its session
        attempt.had_doubt = True
        queue = await self._io.queue(attempt.parent)
        mine = [c.name for c in queue if c.name.startswith(attempt.prefix)]
        if not mine:
            return
        await self._io.delete_children(attempt.parent, mine[1:])
        path = f"{attempt.parent}/{mine[0]}"
        [stat] = await self._io.call(protocol.ExistsRequest(path=path, watch=False))
        if found(stat) is not None:
            self._set_node(attempt, Node(path, session_id, stat.stat.created_zxid))

    async def _wait_for(
        self, attempt: _Attempt, predecessor: str, first_in_line: bool, deadline: float | None
    ) -> bool:
        """Sleep until ``predecessor`` changes, our node or the session does, or ``deadline``.

        True when the lock is ours without listing again: the deleted predecessor was the
        holder (first in our listing, or a grant of this backend: the lowest node then,
        nothing below it can come back), and a node created after our listing is behind
        ours.  A watch on our own node, set in the same round trip, tells if it went (its
        reply is handled before this one's).
        """
        deleted = False
        was_holder = first_in_line

        def on_event(event_type: int) -> None:
            nonlocal deleted, was_holder
            if event_type == EVENT_DELETED:
                deleted = True
                was_holder = was_holder or predecessor in self._ended
            attempt.event.set()

        zk = self._io.session
        node = attempt.node
        assert node is not None
        zk.watch(predecessor, on_event)
        self._arm(node)
        try:
            # getData rather than exists: on a node that is already gone it sets no watch.
            [reply] = await self._io.call(protocol.GetDataRequest(path=predecessor, watch=True))
            if found(reply) is None:
                on_event(EVENT_DELETED)  # gone already
            else:
                timeout = None if deadline is None else deadline - monotonic()
                if timeout is None or timeout > 0:
                    await attempt.event.wait(timeout)
        finally:
            zk.unwatch(predecessor, on_event)
        return deleted and was_holder and not node.gone

    def _grant(self, attempt: _Attempt) -> Grant | None:
        """The attempt's node is the lowest: the lock is ours (if its session still is)."""
        node = attempt.node
        assert node is not None
        if not self._io.session.usable(node.session_id) or node.gone:
            # The node died (or may have died) with its session, or was deleted.
            self._set_node(attempt, None)
            return None
        request = attempt.request
        grant = node.grant = Grant(request.name, request.owner, node.czxid, None, node)
        node.sweep_prefix = attempt.prefix if attempt.had_doubt else None
        self._grants[node.path] = grant
        attempt.node = None  # the grant's now, with its watch
        if not node.armed:
            # Later: most uncontended critical sections end first and cost no request for it
            # (a node deleted meanwhile is noticed by the watch's reply).
            asyncio.get_running_loop().call_later(OWN_WATCH_DELAY, self._arm, node)
        return grant

    def _arm(self, node: Node) -> None:
        """Set the server-side watch on a node of ours; its reply tells if it is gone."""
        zk = self.session
        if node.armed or node.watch is None or zk is None or not zk.connected:
            # Set already, or the node is no longer ours to watch; or disconnected: the
            # reconnection sets it again (the path stays in the session's watch table).
            return
        [fut] = zk.send(protocol.GetDataRequest(path=node.path, watch=True))
        node.armed = True
        fut.add_done_callback(functools.partial(self._arm_reply, node))

    @staticmethod
    def _arm_reply(node: Node, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), exc.NoNode) and node.watch:
            node.watch(EVENT_DELETED)  # gone already: as if the watch had fired

    def _forget(self, grant: Grant) -> None:
        """No longer held: from now on a deletion of its node is no loss."""
        node: Node = grant.data
        if self._grants.get(node.path) is grant:
            del self._grants[node.path]
            self._ended[node.path] = None
            if len(self._ended) > ENDED_MEMORY:
                self._ended.popitem(last=False)
        self._unwatch(node)

    def _lose(self, grants: Sequence[Grant], reason: str) -> None:
        for grant in grants:
            self._forget(grant)
        if grants and self._on_lost is not None:
            self._on_lost(list(grants), reason)  # (the core's callback does not raise)

    async def _leave(self, attempt: _Attempt, what: str) -> None:
        """Delete the attempt's node, and its prefix's nodes if a create reply was lost."""
        node = attempt.node
        self._set_node(attempt, None)
        doubt, attempt.in_doubt = attempt.in_doubt, None
        if doubt is not None:
            await self._io.sweep(attempt.parent, attempt.prefix, doubt, what)
        if node is not None:
            await self._io.remove(node.path, node.session_id, what)

    async def release(self, grant: Grant) -> bool:
        node: Node = grant.data
        self._forget(grant)  # from now on a deletion of the node is no loss
        zk = self._io.session
        if zk.session_id != node.session_id:
            return False  # the node ended with its session
        if zk.presumed_dead:
            # The lease was already reported lost; do not hold the caller up while the
            # servers are unreachable: delete the node once (if ever) they answer again.
            self._io.remove_later(node.path, node.session_id, "release")
            return False
        with self._translate("release"):
            deleted = await self._io.remove(node.path, node.session_id, "release")
            if node.sweep_prefix is not None:
                parent = node.path.rpartition("/")[0]
                with contextlib.suppress(LeftBehind):  # then it goes on in the background
                    await self._io.sweep(parent, node.sweep_prefix, node.session_id, "release")
        return deleted

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        """Check that each node still exists in this session (the session is the lease)."""
        started = monotonic()
        zk = self._io.session
        with self._translate("renew"):
            replies = await self._io.call(
                *(protocol.ExistsRequest(path=g.data.path, watch=False) for g in grants)
            )
            results: list[float | None] = []
            for grant, reply in zip(grants, replies, strict=True):
                node: Node = grant.data
                ok = found(reply) is not None and reply.stat.ephemeral_owner == node.session_id
                ok = ok and zk.usable(node.session_id) and self._grants.get(node.path) is grant
                results.append(started + ttl if ok else None)
            return results

    async def abandon(self, request: Request) -> None:
        attempt = self._attempts.pop((request.name, request.owner), None)
        if self._closing or self.session is None:
            return  # closing the session deleted its nodes
        with self._translate("abandon"):
            if attempt is not None:
                await self._leave(attempt, "abandon")
            else:
                prefix = f"{escape_segment(request.owner)}#"
                parent = self.lock_path(request.name)
                await self._io.sweep(parent, prefix, self._io.session.session_id, "abandon")

    async def status(self, name: str) -> LockStatus | None:
        parent = self.lock_path(name)
        with self._translate("status"):
            for _ in range(5):  # looks again while the holder leaves under the look
                queue = await self._io.queue(parent)
                if not queue:
                    return None
                holder = queue[0]
                [reply] = await self._io.call(
                    protocol.ExistsRequest(path=f"{parent}/{holder.name}", watch=False)
                )
                if found(reply) is not None:
                    owner = unescape_segment(holder.owner)
                    return LockStatus(name, owner, reply.stat.created_zxid, None, len(queue) - 1)
        return None  # the holder changed under every look

    async def force_release(self, name: str) -> bool:
        parent = self.lock_path(name)
        with self._translate("force_release"):
            queue = await self._io.queue(parent)
            if not queue:
                return False
            [reply] = await self._io.call(
                protocol.DeleteRequest(path=f"{parent}/{queue[0].name}", version=-1)
            )
            return found(reply) is not None


def _passed(deadline: float | None) -> bool:
    return deadline is not None and monotonic() >= deadline


def _acl(acl: Any, username: str | None) -> tuple[str, list[Any]]:
    """``(name, ACL list)`` of the nodes a client creates: a preset, or ``"custom"``."""
    if isinstance(acl, list | tuple):
        if not acl or not all(isinstance(item, ACL) for item in acl):
            raise ConfigurationError("option 'acl' must be a non-empty list of aiozk.ACL")
        return "custom", list(acl)
    if not isinstance(acl, str) or acl not in ACL_PRESETS:
        raise ConfigurationError(
            f"option 'acl' must be one of {', '.join(ACL_PRESETS)} or a list of "
            f"aiozk.ACL, got {acl!r}"
        )
    if acl != "open" and username is None:
        raise ConfigurationError(
            f"acl={acl!r} needs digest credentials (zookeeper://USER:PASSWORD@...)"
        )
    return acl, list(ACL_PRESETS[acl])
