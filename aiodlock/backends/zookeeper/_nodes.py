"""The one translation of aiozk's errors, round trips bounded by ``op_timeout``, and the
deletions that must happen (left to the core's ``Guaranteed`` after ``op_timeout``: a lock
node left behind would block the lock, pitfall 7)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiozk import exc, protocol

from ..._errors import BackendError, BackendTimeout, translating
from ..._retry import Guaranteed
from ..._types import monotonic
from ._paths import Child, order
from ._session import CreateContainerRequest, Disconnected, Session

T = TypeVar("T")


class Raced(BackendError):
    """The nodes changed under a look (a lock node reaped, a holder gone): look again."""


class LeftBehind(BackendTimeout):
    """A deletion not confirmed within ``op_timeout``: the clean-up goes on with it."""


def reconnectable(error: BackendError) -> bool:
    """The connection was lost: worth trying again once the session is connected again."""
    return isinstance(error.__cause__, Disconnected)


def found(reply: Any) -> Any:
    """A request's reply; None when the node does not exist; any other refusal is raised."""
    if isinstance(reply, exc.NoNode):
        return None
    if isinstance(reply, Exception):
        raise reply
    return reply


def translate(what: str, secrets: tuple[str, ...] = ()) -> contextlib.AbstractContextManager[None]:
    return translating(
        "zookeeper",
        (exc.ZKError,),
        (exc.TimeoutError, exc.OperationTimeout),
        what=what,
        secrets=secrets,
        transient=(Disconnected,),
    )


class Nodes:
    """Requests on the nodes under ``locks`` (``{chroot}/{namespace}/locks``) in ``session``."""

    def __init__(
        self, session: Session, locks: str, acl: list[Any], secrets: tuple[str, ...]
    ) -> None:
        self.session = session
        self.acl = acl
        self.op_timeout = session.op_timeout
        self.secrets = secrets
        segments = locks.split("/")[1:]
        #: The persistent nodes above every lock node, top first (chroot, namespace, locks).
        self.above = ["/" + "/".join(segments[: i + 1]) for i in range(len(segments))]
        self.closed = False
        self.cleanup = Guaranteed(
            "zookeeper: delete", wait_ready=session.wait_connected, retry_if=reconnectable
        )

    async def aclose(self) -> None:
        """No more requests; stop the deletions left to the background."""
        self.closed = True
        await self.cleanup.aclose()

    async def call(self, *requests: Any) -> list[Any]:
        """One round trip, bounded by ``op_timeout`` (see :meth:`Session.call`)."""
        if self.closed:
            raise BackendError("zookeeper: the client is not open (or was closed)")
        async with asyncio.timeout(self.op_timeout):
            return await self.session.call(*requests)

    async def queue(self, parent: str) -> list[Child]:
        """The lock ``parent``'s queue, the holder first ([] when it does not exist)."""
        [result] = await self.call(protocol.GetChildrenRequest(path=parent, watch=False))
        return [] if found(result) is None else order(result.children)

    async def delete_children(self, parent: str, names: Sequence[str]) -> None:
        """Delete ``parent``'s children ``names`` (one round trip; gone already is fine)."""
        if not names:
            return
        results = await self.call(
            *(protocol.DeleteRequest(path=f"{parent}/{name}", version=-1) for name in names)
        )
        for result in results:
            found(result)

    async def make_parents(self, parent: str) -> None:
        """Create the lock node and the nodes above it (NodeExists is fine)."""
        chain: list[Any] = [
            protocol.Create2Request(path=path, data=b"", acl=self.acl, flags=0)
            for path in self.above
        ]
        # The lock node itself is a container: the server deletes it once it is empty.
        chain.append(CreateContainerRequest(path=parent, data=b"", acl=self.acl, flags=0))
        results = await self.call(*chain)
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

    async def remove(self, path: str, session_id: int, what: str) -> bool:
        """Delete ``path`` (of session ``session_id``) until it or its session is gone;
        whether this call deleted it.  :class:`LeftBehind` after ``op_timeout``."""
        deletion = self._deletion(path, session_id, what)
        return await self._now_or_later((path, ""), deletion, "delete a lock node")

    def remove_later(self, path: str, session_id: int, what: str) -> None:
        """:meth:`remove` in the background only (once, if ever, a server answers)."""
        self.cleanup.later((path, ""), self._deletion(path, session_id, what))

    async def sweep(self, parent: str, prefix: str, session_id: int, what: str) -> None:
        """Delete every child of ``parent`` whose name starts with ``prefix`` (as remove)."""

        async def sweep() -> None:
            with translate(what, self.secrets):
                if self.session.session_id == session_id:
                    queue = await self.queue(parent)
                    await self.delete_children(
                        parent, [c.name for c in queue if c.name.startswith(prefix)]
                    )

        await self._now_or_later((parent, prefix), sweep, "clean up a lock attempt")

    def _deletion(self, path: str, session_id: int, what: str) -> Callable[[], Awaitable[bool]]:
        zk = self.session
        sent = False

        async def delete() -> bool:
            nonlocal sent
            with translate(what, self.secrets):
                if zk.session_id != session_id:
                    return sent  # the node ended with its session
                if not zk.connected:
                    raise Disconnected()
                try:
                    [result] = await self.call(protocol.DeleteRequest(path=path, version=-1))
                except Disconnected:
                    sent = True
                    raise
                # Already gone: it was ours only if an earlier, unconfirmed try deleted it.
                return found(result) is not None or sent

        return delete

    async def _now_or_later(
        self, key: tuple[str, str], action: Callable[[], Awaitable[T]], what: str
    ) -> T:
        try:
            return await self.cleanup.run(key, action, until=monotonic() + self.op_timeout)
        except BackendError as error:
            if not reconnectable(error):
                raise
        raise LeftBehind(
            f"zookeeper: could not {what} within {self.op_timeout:g} s; it is retried in the "
            f"background until it or its session is gone"
        )
