"""The leases a client holds: each one's node, the holder's watch on it, the loss report.

A holder learns from a watch on its own node that someone else deleted it
(``force_release``, an administrator); the loss goes to the core's callback.  The nodes of
grants that ended lately are remembered: a waiter right behind one of them knows, when it
is deleted, that the lock is its own (a granted node was the lowest: nothing below it can
come back), without listing the queue again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

from aiozk import exc, protocol

from ..._types import Grant, LostCallback
from ._session import EVENT_DATA_CHANGED, Session, WatchCallback

__all__ = ["ENDED_MEMORY", "OWN_WATCH_DELAY", "Holds", "Node"]

log = logging.getLogger("aiodlock.zookeeper")

#: Seconds after a grant when the holder's watch on its own node is set (see Holds.add).
OWN_WATCH_DELAY = 0.05
#: How many ended holder nodes a backend remembers (for handoffs without a listing).
ENDED_MEMORY = 4096


@dataclasses.dataclass(slots=True, eq=False)
class Node:
    """``Grant.data``: the lock node of a grant."""

    path: str
    session_id: int
    watch: WatchCallback | None = None
    arm_timer: asyncio.TimerHandle | None = None
    #: Set when a create of the attempt had a lost reply: the server may still apply it
    #: after the lookup (through another member), so the release sweeps the prefix.
    sweep_prefix: str | None = None


class Holds:
    """Path -> grant for every lease of one backend, in the backend's ``session``."""

    def __init__(self) -> None:
        self.session: Session | None = None  # None while the backend is not open
        self.on_lost: LostCallback | None = None  # the core's, given to the backend's open()
        self._grants: dict[str, Grant] = {}
        #: Nodes of this backend's grants that ended lately (path -> None, oldest first).
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()

    def holds(self, grant: Grant) -> bool:
        """Is ``grant`` still held (not released, lost or forgotten)?"""
        return self._grants.get(grant.data.path) is grant

    def ended(self, path: str) -> bool:
        """Was ``path`` the node of a grant of this backend, now ended?"""
        return path in self._ended

    def of_session(self, session_id: int | None = None) -> list[Grant]:
        """The grants held in session ``session_id`` (None: every grant)."""
        grants = self._grants.values()
        return [g for g in grants if session_id is None or g.data.session_id == session_id]

    def add(self, grant: Grant, *, armed: bool) -> None:
        """Hold ``grant`` and watch its node, so that a deletion by anyone else is a loss.

        Unless a waiter set it already (``armed``), the watch is set ``OWN_WATCH_DELAY``
        after the grant: most uncontended critical sections are shorter, and cost no
        request for it.  A node deleted before is noticed by the reply to the watch.
        """
        node: Node = grant.data
        assert self.session is not None
        self._grants[node.path] = grant
        node.watch = functools.partial(self._own_node_event, grant)
        self.session.watch(node.path, node.watch)
        if not armed:
            node.arm_timer = asyncio.get_running_loop().call_later(
                OWN_WATCH_DELAY, self._send_own_watch, grant
            )

    def forget(self, grant: Grant) -> None:
        """No longer held: from now on a deletion of its node is no loss."""
        node: Node = grant.data
        if self._grants.get(node.path) is grant:
            del self._grants[node.path]
            self._ended[node.path] = None
            if len(self._ended) > ENDED_MEMORY:
                self._ended.popitem(last=False)
        if node.arm_timer is not None:
            node.arm_timer.cancel()
            node.arm_timer = None
        if node.watch is not None and self.session is not None:
            self.session.unwatch(node.path, node.watch)
            node.watch = None

    def lose(self, grants: Sequence[Grant], reason: str) -> None:
        """Forget ``grants`` and report them lost to the core."""
        for grant in grants:
            self.forget(grant)
        if grants and self.on_lost is not None:
            try:
                self.on_lost(list(grants), reason)
            except Exception:  # pragma: no cover - the core's callback must not raise
                log.exception("zookeeper: the lost-lease callback failed")

    def _send_own_watch(self, grant: Grant) -> None:
        node: Node = grant.data
        node.arm_timer = None
        if not self.holds(grant) or self.session is None:
            return
        fut = self.session.send_nowait(protocol.GetDataRequest(path=node.path, watch=True))
        if fut is not None:
            # Lost with the connection, the watch is set again on reconnection (the path
            # stays in the session's watch table).
            fut.add_done_callback(functools.partial(self._own_watch_reply, grant))

    def _own_watch_reply(self, grant: Grant, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), exc.NoNode):
            self._vanished(grant)

    def _own_node_event(self, grant: Grant, event_type: int) -> None:
        if event_type == EVENT_DATA_CHANGED:
            self._send_own_watch(grant)  # a watch fires once: set it again
        else:
            self._vanished(grant)

    def _vanished(self, grant: Grant) -> None:
        node: Node = grant.data
        if not self.holds(grant):
            return  # released, or already reported
        if self.session is None or node.session_id != self.session.session_id:
            self.forget(grant)  # its session ended: reported with the session event
            return
        self.lose([grant], "the lock node was deleted by someone else (force_release?)")
