"""RedisNode: the lock protocol on one Redis deployment, over pipelined links.

Every call is ONE round trip on a :class:`~._wire.Link` (a NOSCRIPT answer costs a second
one, sent by the pipe itself), bounded by ``op_timeout`` through the link's own timer, and
raises only :class:`~aiodlock.BackendError` / :class:`~aiodlock.BackendTimeout`.

Which link a call goes to is the deployment's business (:class:`Links`): one server, the
master a Sentinel names (:class:`ServerLinks`) or the master of the key's Cluster slot
(:class:`~._deployments.ClusterLinks`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, Final, Protocol

import anyio

from ..._errors import BackendError, translating
from ._scripts import (
    ABANDON,
    ACQUIRE,
    ACQUIRE_FAIR,
    FORCE_RELEASE,
    RELEASE,
    RELEASE_TRANSFER,
    RENEW,
    STATUS,
    LockKeys,
    Memo,
)
from ._wire import WIRE_ERRORS, CallTemplate, Link, OnReply, ReplyError, ScriptCall, pack, resolver

#: Error replies that time cures: a server loading its data after a restart, read-only or
#: down while a failover runs, a Cluster slot moving.
TRANSIENT_REPLIES: Final = ("LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN")


class TransientReply(ReplyError):
    """An error reply of :data:`TRANSIENT_REPLIES` (marked transient when translated)."""


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.5))


class GrantData:
    """What a grant needs to be renewed and released (a plain class: made per acquire)."""

    __slots__ = ("keys", "token")

    def __init__(self, keys: LockKeys, token: str) -> None:
        self.keys = keys
        self.token = token

    def __repr__(self) -> str:
        return f"<GrantData {self.keys.lock!r} token={self.token}>"


class Links(Protocol):
    """Where a deployment's commands go (each method sends at once, nothing is awaited)."""

    def eval(self, call: ScriptCall, deliver: OnReply) -> None:
        """Run ``call`` on the server of its keys; ``deliver`` gets the reply."""

    def eval_many(self, calls: Sequence[ScriptCall], deliver: OnReply) -> None:
        """Run ``calls`` (one write per server); ``deliver`` gets the list of replies, or
        the first failure."""

    def eval_wait(self, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
        """Run ``call`` then ``wait`` (a WAIT) on one connection of that server, kept for
        such calls (a WAIT blocks its connection); ``deliver`` gets ``[reply, acks]``."""

    async def ping(self) -> None:
        """Connect (loading the scripts) and check that every server answers."""

    def reset(self) -> None:
        """The servers may have changed (a failover, a READONLY answer): find them anew."""

    def close(self) -> None: ...


def eval_wait(link: Link, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
    """``call`` and ``wait`` in one write on ``link``: ``deliver`` gets ``[reply, acks]``.

    NOTE: after a NOSCRIPT answer the pipe sends the script again behind the WAIT, which
    then measured nothing of it: the WAIT is sent again once the script answered.
    """
    got: list[Any] = []  # the script's answer, or _EARLY when the WAIT's came first

    def script(reply: Any) -> None:
        if not got:
            got.append(reply)
        elif isinstance(reply, BaseException):
            deliver(reply)
        else:
            got[0] = reply
            link.send(wait, [waited])

    def waited(reply: Any) -> None:
        if not got:
            got.append(_EARLY)
        else:
            first = got[0]
            deliver(first if isinstance(first, BaseException) else [first, reply])

    link.send(call.data + wait, [script, waited], [call, None])


_EARLY: Final = object()


class ServerLinks:
    """One server (plain, Unix socket, TLS, or the master a Sentinel names): ONE link for
    every command, and one more, made on first use, for grants that ``WAIT``."""

    def __init__(self, link: Link, make_wait_link: Any = None) -> None:
        self.link = link
        self._make_wait_link = make_wait_link
        self._wait_link: Link | None = None
        # NOTE: the link's own methods, not wrappers: the hot path pays no extra call.
        self.eval = link.eval
        self.eval_many = link.eval_many

    def eval_wait(self, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
        if self._wait_link is None:
            self._wait_link = self._make_wait_link()
        eval_wait(self._wait_link, call, wait, deliver)

    async def ping(self) -> None:
        reply = await self.link.call(pack(b"PING"))
        if isinstance(reply, BaseException):
            raise reply

    def reset(self) -> None:
        for link in (self.link, self._wait_link):
            if link is not None and link.idle():
                link.drop(ConnectionError("the server may have changed"))

    def close(self) -> None:
        self.link.close()
        if self._wait_link is not None:
            self._wait_link.close()


class RedisNode:
    """The lock protocol on one Redis deployment.

    ``sync_replicas=N`` sends ``WAIT N sync_timeout`` after the acquire script in the same
    write: a grant that fewer than N replicas acknowledged in time is released again and
    reported as a :class:`~aiodlock.BackendError`.
    """

    def __init__(
        self,
        links: Links,
        *,
        label: str = "redis",
        secrets: tuple[str, ...] = (),
        sync_replicas: int = 0,
        sync_timeout: float = 1.0,
    ) -> None:
        self.links = links
        self._eval = links.eval
        self.label = label
        self.sync_replicas = sync_replicas
        self.sync_timeout_ms = ms(sync_timeout)
        self._wait = pack(b"WAIT", sync_replicas, self.sync_timeout_ms)
        self._secrets = tuple(s for s in secrets if s)
        #: The hot calls, packed once (see acquire_call and release_calls).
        self._acquire_calls: Memo[tuple[LockKeys, str, int], ScriptCall] = Memo(acquire_call)
        self._release_calls: Memo[tuple[LockKeys, str], tuple[CallTemplate, ScriptCall]] = Memo(
            release_calls
        )
        self._transfer_calls: Memo[tuple[LockKeys, str, str, int], CallTemplate] = Memo(
            transfer_template
        )

    @property
    def link(self) -> Link | None:
        """The one command link of a single server (None on a Cluster)."""
        return self.links.link if isinstance(self.links, ServerLinks) else None

    def close(self) -> None:
        self.links.close()

    def __repr__(self) -> str:
        return f"<RedisNode {self.label}>"

    # -- sending and answers ---------------------------------------------------------------

    @contextlib.contextmanager
    def translate(self, what: str) -> Iterator[None]:
        """The one place where failures become aiodlock's exceptions."""
        with translating(
            self.label, WIRE_ERRORS, what=what, secrets=self._secrets, transient=(TransientReply,)
        ):
            yield

    def _error(self, exc: BaseException, what: str) -> BaseException:
        """``exc`` (a failed call's outcome) as :meth:`translate` maps it."""
        if type(exc) is ReplyError and str(exc).startswith(TRANSIENT_REPLIES):
            if str(exc).startswith("READONLY"):
                self.links.reset()  # a master turned replica (a failover): find the new one
            exc = TransientReply(str(exc))
        try:
            with self.translate(what):
                raise exc
        except BaseException as mapped:
            return mapped
        raise AssertionError("unreachable")  # pragma: no cover

    def start(self, call: ScriptCall) -> asyncio.Future[Any]:
        """Send ``call`` now; :meth:`finish` gets its answer (never raises)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._eval(call, resolver(future))
        return future

    async def finish(self, sent: asyncio.Future[Any], what: str) -> Any:
        """The answer to :meth:`start`, errors translated."""
        reply = await sent
        if isinstance(reply, BaseException):
            raise self._error(reply, what) from reply
        return reply

    def run(self, script_call: ScriptCall) -> Awaitable[Any]:
        """Run one script call (what to await: its answer)."""
        return self.finish(self.start(script_call), script_call.script.name)

    async def _run_many(self, calls: Sequence[ScriptCall], what: str) -> list[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.links.eval_many(calls, resolver(future))
        return await self.finish(future, what)  # type: ignore[no-any-return]

    # -- the protocol ----------------------------------------------------------------------

    def acquire(
        self,
        keys: LockKeys,
        owner: str,
        lease_ms: int,
        *,
        fair: bool = False,
        urgent: bool = False,
        queue: bool = False,
        waiter_ms: int = 0,
    ) -> Awaitable[int]:
        """One attempt (what to await): the token (``>= 1``) if granted; else ``-1 - ms``
        until a retry may be worth it (the holder's remaining lease...), or 0 when no such
        time is known.  ``fair`` or ``urgent``: in line (see ACQUIRE_FAIR)."""
        if fair or urgent:
            call = ScriptCall(
                ACQUIRE_FAIR,
                (keys.lock, keys.counter, keys.queue, keys.deadlines),
                (owner, lease_ms, waiter_ms, b"1" if queue else b"0", b"1" if urgent else b"0"),
            )
        else:
            # The hot path: the call is packed once per owner and lease length.
            call = self._acquire_calls((keys, owner, lease_ms))
        if not self.sync_replicas:
            return self.finish(self.start(call), call.script.name)  # (run() inlined: hot)
        return self._acquire_synced(keys, owner, call)

    async def _acquire_synced(self, keys: LockKeys, owner: str, call: ScriptCall) -> int:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.links.eval_wait(call, self._wait, resolver(future))
        reply, acks = await self.finish(future, call.script.name)
        value = int(reply)
        if value > 0 and int(acks) < self.sync_replicas:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(BackendError):
                    await self.release(keys, owner, str(value))
            raise BackendError(
                f"{self.label}: only {acks} of {self.sync_replicas} replicas acknowledged the "
                f"grant of {keys.name!r} within {self.sync_timeout_ms} ms (sync_replicas); "
                f"the lock was released again"
            )
        return value

    async def renew(self, items: Sequence[tuple[LockKeys, str, str]], lease_ms: int) -> list[bool]:
        """Extend many leases in one pipeline (per server): ``(keys, owner, token or '')``.

        Renewals do not wait for replicas (``sync_replicas`` guards grants): after a failover
        the promoted replica may have no replica of its own, and demanding acknowledgements
        then would lose every lease that the failover had kept.
        """
        calls = [ScriptCall(RENEW, (k.lock,), (who, token, lease_ms)) for k, who, token in items]
        replies = await self._run_many(calls, "renew")
        return [reply == 1 for reply in replies]

    def release(self, keys: LockKeys, owner: str, token: str = "") -> Awaitable[Any]:
        """Compare-and-delete by owner (and token unless ``''``); wakes the next waiter.
        Sent at once; await the script's answer (1: released, 0: not held by ``owner``)."""
        template, anyone = self._release_calls((keys, owner))
        return self.finish(self.start(template.fill(token) if token else anyone), RELEASE.name)

    async def release_transfer(
        self, keys: LockKeys, owner: str, token: str, receiver: str, lease_ms: int
    ) -> int:
        """Release ``owner``'s hold and grant the lock to ``receiver`` in one round trip.

        Returns the receiver's new token (``>= 1``), 0 when ``owner`` did not hold the lock
        (nothing changed), -1 when it was released but not handed over (a fair queue
        exists; its next waiter was notified as :meth:`release` does).
        """
        call = self._transfer_calls((keys, owner, receiver, lease_ms)).fill(token)
        return int(await self.run(call))

    async def abandon(self, keys: LockKeys, owner: str) -> bool:
        """Drop the owner's hold and queue entry, if any; True if it held the lock."""
        k = (keys.lock, keys.queue, keys.deadlines)
        call = ScriptCall(ABANDON, k, (owner, keys.channel, keys.waiter_prefix))
        return bool(await self.run(call) == 1)

    async def force_release(self, keys: LockKeys) -> bool:
        call = ScriptCall(
            FORCE_RELEASE,
            (keys.lock, keys.queue, keys.deadlines),
            (keys.channel, keys.waiter_prefix),
        )
        return bool(await self.run(call) == 1)

    async def status(self, keys: LockKeys) -> tuple[str, int, int, int] | None:
        """``(owner, token, pttl ms, live fair waiters or -1)`` or None when free."""
        reply = await self.run(ScriptCall(STATUS, (keys.lock, keys.deadlines), ()))
        if not reply:
            return None
        owner = reply[0]
        if isinstance(owner, bytes):
            owner = owner.decode("utf-8", "surrogateescape")
        return str(owner), int(reply[1]), int(reply[2]), int(reply[3])

    async def ping(self, timeout: float) -> None:
        """Check within ``timeout`` that the servers answer (and that we may talk to them)."""
        try:
            async with asyncio.timeout(timeout):
                await self.links.ping()
        except Exception as exc:
            raise self._error(exc, "connect") from exc


def _release_call(
    keys: LockKeys, owner: str, token: str
) -> tuple[tuple[bytes, ...], tuple[str, str, bytes, bytes]]:
    """KEYS and ARGV of the RELEASE script."""
    return (keys.lock, keys.queue, keys.deadlines), (owner, token, keys.channel, keys.waiter_prefix)


def transfer_template(index: tuple[LockKeys, str, str, int]) -> CallTemplate:
    """The RELEASE_TRANSFER call of ``(keys, releasing owner, receiving owner, lease ms)``,
    packed but for the releaser's token (argument 1): memoize it, fill in the token per
    hand-off."""
    keys, owner, receiver, lease_ms = index
    k = (keys.lock, keys.counter, keys.queue, keys.deadlines)
    a = (owner, "", receiver, lease_ms, keys.channel, keys.waiter_prefix)
    return CallTemplate(RELEASE_TRANSFER, k, a, 1)


def acquire_call(index: tuple[LockKeys, str, int]) -> ScriptCall:
    """The (non-fair) ACQUIRE call of ``(keys, owner, lease ms)``, packed once: an owner's
    attempts repeat it (memoize it)."""
    keys, owner, lease_ms = index
    return ScriptCall(
        ACQUIRE, (keys.lock, keys.counter, keys.queue, keys.deadlines), (owner, lease_ms)
    )


def release_calls(index: tuple[LockKeys, str]) -> tuple[CallTemplate, ScriptCall]:
    """The RELEASE call of ``(keys, owner)`` packed but for the token, and with the token
    '' (any token of this owner): memoize it, fill in the token per release."""
    keys, owner = index
    k, a = _release_call(keys, owner, "")
    template = CallTemplate(RELEASE, k, a, 1)
    return template, template.fill("")
