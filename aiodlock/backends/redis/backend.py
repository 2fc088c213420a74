"""RedisBackend: ``redis://``, ``rediss://``, ``unix://``, Sentinel and Cluster."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

from ..._errors import BackendError
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
from ..._url import ParsedURL
from ..._wakeup import Backoff, WakeupBoard
from .._base import Backend
from ._deployments import Settings, connect_deployment, parse_settings
from ._node import GrantData, RedisNode, ms
from ._pubsub import Listening, PubSubHub
from ._scripts import LockKeys, key_table


def _nothing() -> None:
    pass


class RedisBackend(Backend):
    """Locks on one Redis server, a Sentinel-managed master or a Redis Cluster.

    See ``docs/backends/redis.md`` for the algorithm, its guarantees and failure modes.
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
        self.settings = settings
        self.config = config
        #: How long a place in line (a fair or urgent waiter's) is kept without a new
        #: attempt: as long as a lease (the waiter asks again every third of it).
        self._lease_waiter_ms = ms(config.watchdog_ttl)
        self._keys = key_table(config.namespace)
        self._closing: Callable[[], None] = _nothing
        self._node: RedisNode | None = None
        self._hub: PubSubHub | None = None
        #: The local waiters by channel, woken by the hub one at a time.
        self.board = WakeupBoard()
        secrets = (settings.password or "", settings.sentinel_password or "")
        self._secrets = tuple(s for s in secrets if s)

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(parse_settings(url, config, options), config)

    def describe(self) -> str:
        return self.settings.shown

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def node(self) -> RedisNode:
        """The protocol on the deployment (after :meth:`open`)."""
        if self._node is None:
            raise BackendError("redis: the backend is not open")
        return self._node

    @property
    def hub(self) -> PubSubHub:
        """The shared pub/sub connection (after :meth:`open`)."""
        if self._hub is None:
            raise BackendError("redis: the backend is not open")
        return self._hub

    @property
    def client(self) -> Any:
        """The redis-py client given as ``client=`` (its settings are used, not it)."""
        return self.settings.client

    async def open(self, on_lost: LostCallback) -> None:
        links, hub_link, self._closing = connect_deployment(self.settings, self.config)
        self._node = RedisNode(
            links,
            label="redis",
            secrets=self._secrets,
            sync_replicas=self.settings.sync_replicas,
            sync_timeout=self.settings.sync_timeout,
        )
        ttl = self.config.watchdog_ttl
        self._hub = PubSubHub(
            hub_link,
            self.board,
            op_timeout=self.config.op_timeout,
            ping_interval=max(1.0, min(10.0, ttl / 3)),
            label="redis",
            secrets=self._secrets,
            on_reconnect=links.reset,
        )
        await self._node.ping(self.config.connect_timeout)

    async def aclose(self) -> None:
        hub, self._hub = self._hub, None
        node, self._node = self._node, None
        if hub is not None:
            await hub.aclose()
        if node is not None:
            node.close()
        self._closing()

    # -- the protocol ----------------------------------------------------------------------

    def keys_for(self, name: str) -> LockKeys:
        """The keys and channels of lock ``name`` in this backend's namespace."""
        return self._keys(name)

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        name = request.name
        keys = self._keys(name)
        ttl = request.ttl
        # (an urgent waiter takes a place in line, as a fair one does)
        urgent = request.urgent and will_wait and not request.fair
        started = monotonic()
        value = await self.node.acquire(
            keys,
            request.owner,
            ms(ttl),
            fair=request.fair,
            urgent=urgent,
            queue=will_wait,
            waiter_ms=self._lease_waiter_ms,
        )
        if value > 0:
            data = GrantData(keys, str(value))
            return Grant(name, request.owner, value, started + ttl, data)
        return Busy((-1 - value) / 1000 if value else None)

    def waiter(self, request: Request) -> contextlib.AbstractAsyncContextManager[Waiter]:
        keys = self._keys(request.name)
        if request.fair:  # (its own channel, where only its turn is announced)
            return Listening(
                self.board, (self.hub,), keys.waiter_channel(request.owner), None, Backoff()
            )
        # (in line, once urgent, the message that calls it names it)
        tag = request.owner.encode("utf-8", "surrogatepass")
        return Listening(self.board, (self.hub,), keys.channel, tag, Backoff())

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        if not grants:
            return []
        started = monotonic()
        items = [(_data(g).keys, g.owner, _data(g).token) for g in grants]
        results = await self.node.renew(items, ms(ttl))
        expires_at = started + ttl
        return [expires_at if ok else None for ok in results]

    async def release(self, grant: Grant) -> bool:
        data = _data(grant)
        return bool(await self.node.release(data.keys, grant.owner, data.token) == 1)

    def start_release(self, grant: Grant) -> Awaitable[bool]:
        node, data = self._node, grant.data
        if node is None or not isinstance(data, GrantData):
            return self.release(grant)
        return _is_one(node.release(data.keys, grant.owner, data.token))

    async def transfer(self, grant: Grant, to: Request) -> Grant | bool:
        data = _data(grant)
        node = self.node
        if node.sync_replicas:
            # (a grant must wait for its replicas, which the one-step script does not)
            return bool(await node.release(data.keys, grant.owner, data.token) == 1)
        keys = data.keys
        started = monotonic()  # before sending: the receiver's lease is conservative
        value = await node.release_transfer(keys, grant.owner, data.token, to.owner, ms(to.ttl))
        if value > 0:
            return Grant(grant.name, to.owner, value, started + to.ttl, GrantData(keys, str(value)))
        return value < 0

    async def abandon(self, request: Request) -> None:
        await self.node.abandon(self.keys_for(request.name), request.owner)

    async def status(self, name: str) -> LockStatus | None:
        found = await self.node.status(self.keys_for(name))
        if found is None:
            return None
        owner, token, pttl, waiters = found
        return LockStatus(
            name,
            owner,
            token,
            pttl / 1000 if pttl >= 0 else None,
            waiters if waiters >= 0 else None,
        )

    async def force_release(self, name: str) -> bool:
        return await self.node.force_release(self.keys_for(name))


async def _is_one(pending: Awaitable[Any]) -> bool:
    return bool(await pending == 1)


def _data(grant: Grant) -> GrantData:
    data = grant.data
    if not isinstance(data, GrantData):
        raise TypeError(f"not a redis grant: {grant!r}")
    return data
