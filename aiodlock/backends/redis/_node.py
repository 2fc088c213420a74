"""What both Redis backends send: the script calls (the hot ones packed once), and the
links of one server (:class:`ServerLinks`; a Cluster's are :class:`~._cluster.ClusterLinks`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from .._base import Backend
from ._scripts import (
    ABANDON,
    ACQUIRE,
    FORCE_RELEASE,
    RELEASE,
    RELEASE_TRANSFER,
    STATUS,
    LockKeys,
    Memo,
    key_table,
)
from ._wire import CallTemplate, Link, OnReply, ReplyError, ScriptCall, pack

if TYPE_CHECKING:
    from ..._types import CommonConfig

S = TypeVar("S")

#: Error replies that time cures: a server loading its data after a restart, read-only or
#: down while a failover runs, a Cluster slot moving.
TRANSIENT_REPLIES: Final = ("LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN")


class TransientReply(ReplyError):
    """An error reply of :data:`TRANSIENT_REPLIES` (marked transient when translated)."""


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.5))


@dataclasses.dataclass(slots=True)
class GrantData:
    """What a grant needs to be renewed and released."""

    keys: LockKeys
    token: str


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
    """Where a deployment's commands go (each method sends at once, nothing is awaited), on
    one server (plain, Unix socket, TLS, or the master a Sentinel names): ONE link for every
    command, and one more, made on first use, for grants that ``WAIT`` (it blocks its
    connection).  ``eval_many`` makes one write per server; ``reset`` drops idle connections
    (the server may have changed: a failover, a READONLY answer)."""

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
    k = (keys.lock, keys.queue, keys.deadlines)
    template = CallTemplate(RELEASE, k, (owner, "", keys.channel, keys.waiter_prefix), 1)
    return template, template.fill("")


def abandon_call(keys: LockKeys, owner: str) -> ScriptCall:
    k = (keys.lock, keys.queue, keys.deadlines)
    return ScriptCall(ABANDON, k, (owner, keys.channel, keys.waiter_prefix))


def force_release_call(keys: LockKeys) -> ScriptCall:
    k = (keys.lock, keys.queue, keys.deadlines)
    return ScriptCall(FORCE_RELEASE, k, (keys.channel, keys.waiter_prefix))


def status_call(keys: LockKeys) -> ScriptCall:
    return ScriptCall(STATUS, (keys.lock, keys.deadlines), ())


class KeyedBackend(Backend, Generic[S]):
    """What both Redis backends share: their settings, keys, and the hot calls packed once
    (an owner's attempts and releases repeat them)."""

    def __init__(self, settings: S, config: CommonConfig) -> None:
        self.settings = settings
        self.config = config
        self._keys = key_table(config.namespace)
        self._acquire_calls: Memo[tuple[LockKeys, str, int], ScriptCall] = Memo(acquire_call)
        self._release_calls: Memo[tuple[LockKeys, str], tuple[CallTemplate, ScriptCall]] = Memo(
            release_calls
        )

    def keys_for(self, name: str) -> LockKeys:
        """The keys and channels of lock ``name`` in this backend's namespace."""
        return self._keys(name)
