"""RedisBackend (``redis://``, ``rediss://``, ``unix://``, Sentinel, Cluster), and what
Redlock shares with it.  Every call is ONE round trip on a pipelined :class:`~._wire.Link`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, Self, TypeVar

from ..._errors import BackendError
from ..._shield import finish
from ..._types import Busy, Capability, Grant, LockStatus, Request, monotonic
from ..._wakeup import Backoff, WakeupBoard
from .._base import Backend
from ._deployments import Links, ServerLinks, connect_deployment
from ._pubsub import Listening, PubSubHub
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
    key_table,
    memo,
)
from ._settings import Settings, parse_settings
from ._wire import (
    CallTemplate,
    Link,
    ReplyError,
    ScriptCall,
    pack,
    resolver,
    wire_error,
)

if TYPE_CHECKING:
    from ..._types import CommonConfig, LostCallback
    from ..._url import ParsedURL

T = TypeVar("T")
S = TypeVar("S")


#: Error replies that time cures: a server loading its data after a restart, read-only or
#: down while a failover runs, a Cluster slot moving (marked transient when translated).
TRANSIENT_REPLIES: Final = ("LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN")


class TransientReply(ReplyError):
    pass


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.5))


@dataclasses.dataclass(slots=True)
class GrantData:
    keys: LockKeys
    token: str


class KeyedBackend(Backend, Generic[S]):
    """What both Redis backends share: their settings, keys, and the hot calls packed once
    (an owner's attempts and releases repeat them)."""

    #: A waiter's rank in line is the time it began to wait by its own clock (the same on
    #: every node of a Redlock), not the server's time when it joined.
    ranks_by_client: bool = False

    def __init__(self, settings: S, config: CommonConfig) -> None:
        self.settings = settings
        self.config = config
        #: How long a place in line (a fair or urgent waiter's) is kept without a new
        #: attempt: as long as a lease (the waiter asks again every third of it).
        self._lease_waiter_ms = ms(config.watchdog_ttl)
        #: The keys and channels of a lock name in this backend's namespace.
        self.keys_for: Callable[[str], LockKeys] = key_table(config.namespace)
        self._acquire_calls: Callable[[tuple[LockKeys, str, int]], ScriptCall] = memo(
            lambda index: ScriptCall(ACQUIRE, index[0].every, index[1:])
        )
        self._release_calls: Callable[[tuple[LockKeys, str]], tuple[CallTemplate, ScriptCall]]
        self._release_calls = memo(release_calls)

    def acquire_call(self, keys: LockKeys, request: Request, will_wait: bool) -> ScriptCall:
        """An attempt: the plain one, or one that takes a place in line (fair, or an urgent
        waiter's, which is non-fair but lets nobody barge past it)."""
        owner, lease_ms = request.owner, ms(request.ttl)
        urgent = request.urgent and will_wait and not request.fair
        if not (request.fair or urgent):
            return self._acquire_calls((keys, owner, lease_ms))
        request.queued = request.queued or will_wait
        flags = (b"1" if will_wait else b"0", b"1" if urgent else b"0")
        rank = str(int(request.waiting_since * 1e6)) if self.ranks_by_client else ""
        args = (owner, lease_ms, self._lease_waiter_ms, *flags, rank)
        return ScriptCall(ACQUIRE_FAIR, keys.every, args)

    def abandon_call(self, keys: LockKeys, owner: str, only: str = "") -> ScriptCall:
        """ABANDON: ``only`` "hold" keeps the place in line, "line" keeps the lock."""
        return ScriptCall(ABANDON, keys.line, (owner, keys.channel, keys.waiter_prefix, only))

    def force_release_call(self, name: str) -> ScriptCall:
        keys = self.keys_for(name)
        return ScriptCall(FORCE_RELEASE, keys.line, (keys.channel, keys.waiter_prefix))

    def status_call(self, name: str) -> ScriptCall:
        keys = self.keys_for(name)
        return ScriptCall(STATUS, (keys.lock, keys.deadlines), ())


class RedisBackend(KeyedBackend[Settings]):
    """Locks on one Redis server, a Sentinel-managed master or a Redis Cluster.

    ``sync_replicas=N`` sends ``WAIT N sync_timeout`` after the acquire script in the same
    write: a grant fewer replicas acknowledged in time is released again (a BackendError).
    """

    backend_name = "redis"
    capabilities = (
        Capability.FAIR
        | Capability.FENCING
        | Capability.CROSS_PROCESS
        | Capability.TRANSFER
        | Capability.URGENT
    )

    def __init__(self, settings: Settings, config: CommonConfig) -> None:
        super().__init__(settings, config)
        self._links: Links | None = None
        self._hub: PubSubHub | None = None
        #: The local waiters by channel, woken by the hub one at a time.
        self.board = WakeupBoard()
        self._secrets = tuple(s for s in (settings.password, settings.sentinel_password) if s)
        self._wait = pack(b"WAIT", settings.sync_replicas, ms(settings.sync_timeout))
        self._transfer_calls: Callable[[tuple[LockKeys, str, str, int]], CallTemplate]
        self._transfer_calls = memo(transfer_template)

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(parse_settings(url, config, options), config)

    def describe(self) -> str:
        return self.settings.shown

    @property
    def links(self) -> Links:
        """Where the deployment's commands go (after :meth:`open`)."""
        links = self._links
        return _opened(links) if links is None else links

    @property
    def link(self) -> Link | None:
        """The one command link of a single server (None on a Cluster)."""
        return self.links.link if isinstance(self.links, ServerLinks) else None

    @property
    def hub(self) -> PubSubHub:
        """The shared pub/sub connection (after :meth:`open`)."""
        return _opened(self._hub)

    @property
    def client(self) -> Any:
        """The redis-py client given as ``client=`` (its settings are used, not it)."""
        return self.settings.client

    async def open(self, on_lost: LostCallback) -> None:
        links, hub_link = connect_deployment(self.settings, self.config)
        self._links = links
        self._hub = PubSubHub(
            hub_link, self.board, self.config, "redis", self._secrets, links.reset
        )
        try:  # (the servers answer, and we may talk to them)
            async with asyncio.timeout(self.config.connect_timeout):
                await links.ping()
        except Exception as exc:
            raise self._error(exc, "connect") from exc

    async def aclose(self) -> None:
        hub, self._hub = self._hub, None
        links, self._links = self._links, None
        if hub is not None:
            await hub.aclose()
        if links is not None:
            links.close()

    def _error(self, exc: BaseException, what: str) -> BaseException:
        """``exc`` (a failed call's outcome) as aiodlock reports it."""
        if type(exc) is ReplyError and str(exc).startswith(TRANSIENT_REPLIES):
            if str(exc).startswith("READONLY"):
                self.links.reset()  # a master turned replica (a failover): find the new one
            exc = TransientReply(str(exc))
        return wire_error("redis", exc, what, self._secrets, (TransientReply,))

    def _ask(self, what: str, send: Callable[..., None], *args: Any) -> Awaitable[Any]:
        """``send(*args, on_reply)`` now; the awaitable gets the reply (or raises)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        send(*args, resolver(future))
        return self._finish(future, what)

    async def _finish(self, sent: asyncio.Future[Any], what: str) -> Any:
        reply = await sent
        if isinstance(reply, BaseException):
            raise self._error(reply, what) from reply
        return reply

    def _run(self, call: ScriptCall) -> Awaitable[Any]:
        return self._ask(call.script.name, self.links.eval, call)

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        name, owner, ttl = request.name, request.owner, request.ttl
        keys = self.keys_for(name)
        started = monotonic()
        call = self.acquire_call(keys, request, will_wait)
        # The script answers the token (>= 1) if granted; else -1 - ms until a retry may be
        # worth it (the holder's remaining lease...), or 0 when no such time is known.
        if self.settings.sync_replicas:
            value = await self._acquire_synced(keys, owner, call)
        else:
            value = await self._run(call)
        if value > 0:
            return Grant(name, owner, value, started + ttl, GrantData(keys, str(value)))
        return Busy((-1 - value) / 1000 if value else None)

    async def _release_quietly(self, keys: LockKeys, owner: str, token: str) -> None:
        with contextlib.suppress(BackendError):
            await self._release(keys, owner, token)

    async def _acquire_synced(self, keys: LockKeys, owner: str, call: ScriptCall) -> int:
        reply, acks = await self._ask(call.script.name, self.links.eval_wait, call, self._wait)
        value = int(reply)
        if value > 0 and int(acks) < self.settings.sync_replicas:
            # (to its end, even if the task is cancelled meanwhile: see _shield)
            await finish(self._release_quietly(keys, owner, str(value)))
            raise BackendError(
                f"redis: only {acks} of {self.settings.sync_replicas} replicas acknowledged the "
                f"grant of {keys.name!r} within {ms(self.settings.sync_timeout)} ms "
                f"(sync_replicas); the lock was released again"
            )
        return value

    def waiter(self, request: Request) -> Listening:
        keys = self.keys_for(request.name)
        hubs = (self.hub,)
        if request.fair:  # (its own channel, where only its turn is announced)
            return Listening(self.board, hubs, keys.waiter_channel(request.owner), None, Backoff())
        # (once urgent, in line: the message that calls it names it)
        tag = request.owner.encode("utf-8", "surrogatepass")
        return Listening(self.board, hubs, keys.channel, tag, Backoff())

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        """One pipeline per server.  Renewals do not wait for replicas (``sync_replicas``
        guards grants): after a failover the promoted replica may have no replica of its
        own, and demanding acknowledgements would lose every lease the failover kept."""
        if not grants:
            return []
        started, lease_ms = monotonic(), ms(ttl)
        calls = [
            ScriptCall(RENEW, (_data(g).keys.lock,), (g.owner, _data(g).token, lease_ms))
            for g in grants
        ]
        replies = await self._ask("renew", self.links.eval_many, calls)
        return [started + ttl if reply == 1 else None for reply in replies]

    def _release(self, keys: LockKeys, owner: str, token: str) -> Awaitable[bool]:
        """Compare-and-delete by owner and token, sent at once (the answer awaited later)."""
        template, _ = self._release_calls((keys, owner))
        return _is_one(self._run(template.fill(token)))

    async def release(self, grant: Grant) -> bool:
        data = _data(grant)
        return await self._release(data.keys, grant.owner, data.token)

    def start_release(self, grant: Grant) -> Awaitable[bool]:
        data = grant.data
        if self._links is None or not isinstance(data, GrantData):
            return self.release(grant)
        return self._release(data.keys, grant.owner, data.token)

    async def transfer(self, grant: Grant, to: Request) -> Grant | bool:
        data = _data(grant)
        if self.settings.sync_replicas:
            # (a grant must wait for its replicas, which the one-step script does not)
            return await self._release(data.keys, grant.owner, data.token)
        keys = data.keys
        started = monotonic()  # before sending: the receiver's lease is conservative
        call = self._transfer_calls((keys, grant.owner, to.owner, ms(to.ttl))).fill(data.token)
        # (the receiver's new token; 0: not held, nothing changed; -1: released, but the
        # first in line was called instead)
        value = int(await self._run(call))
        if value > 0:
            return Grant(grant.name, to.owner, value, started + to.ttl, GrantData(keys, str(value)))
        return value < 0

    async def abandon(self, request: Request) -> None:
        await self._run(self.abandon_call(self.keys_for(request.name), request.owner))

    async def status(self, name: str) -> LockStatus | None:
        reply = await self._run(self.status_call(name))
        if not reply:
            return None
        token, pttl, waiters = map(int, reply[1:4])
        left = pttl / 1000 if pttl >= 0 else None
        owner = reply[0].decode("utf-8", "surrogateescape")
        return LockStatus(name, owner, token, left, waiters if waiters >= 0 else None)

    async def force_release(self, name: str) -> bool:
        return bool(await self._run(self.force_release_call(name)) == 1)


def _opened(thing: T | None) -> T:
    if thing is None:
        raise BackendError("redis: the backend is not open")
    return thing


async def _is_one(pending: Awaitable[Any]) -> bool:
    return bool(await pending == 1)


def _data(grant: Grant) -> GrantData:
    data = grant.data
    if not isinstance(data, GrantData):
        raise TypeError(f"not a redis grant: {grant!r}")
    return data


def transfer_template(index: tuple[LockKeys, str, str, int]) -> CallTemplate:
    """RELEASE_TRANSFER of ``(keys, releasing owner, receiving owner, lease ms)``, packed
    but for the releaser's token."""
    keys, owner, receiver, lease_ms = index
    a = (owner, "", receiver, lease_ms, keys.channel, keys.waiter_prefix)
    return CallTemplate(RELEASE_TRANSFER, keys.every, a, 1)


def release_calls(index: tuple[LockKeys, str]) -> tuple[CallTemplate, ScriptCall]:
    """RELEASE of ``(keys, owner)`` packed but for the token, and with '' (any token)."""
    keys, owner = index
    a = (owner, "", keys.channel, keys.waiter_prefix)
    template = CallTemplate(RELEASE, keys.line, a, 1)
    return template, template.fill("")
