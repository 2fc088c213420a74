"""``redlock://h1:6379,h2:6379,h3:6379``: Redlock over N independent Redis masters.

Each master keeps the same data as a plain ``redis://`` lock: the key layout and the Lua
scripts of :mod:`aiodlock.backends._redis_scripts` (shared with the Redis backend, run by
SHA).  This module adds the quorum on top:

1. note the start on the monotonic clock;
2. ask every node AT ONCE, each answer awaited at most ``node_timeout``; a node that times
   out or fails counts as a no;
3. the lock is held only if a majority (``N // 2 + 1``) said yes and the time spent is
   below the ttl: the lease is then valid until ``start + ttl - drift`` with
   ``drift = ttl * drift_factor + 2 ms``;
4. otherwise the attempt is undone on every node that granted or did not answer (all at
   once) and the waiting loop of the core tries again later (after a random pause of at
   most ``retry_delay`` when the vote was split);
5. renewals (batched by the core's watchdog) and releases fan out the same way;
6. a waiter listens to the release channel of the name on every node (one shared pub/sub
   connection per node, :class:`aiodlock.backends.redis.PubSubHub`) and also retries at
   random intervals, so a lost message or a dead node never strands it;
7. the fencing token is the largest of the per-node ``INCR`` counters among the nodes that
   granted; when they differ, the lagging counters are raised to it on a majority before the
   grant is returned (so that, while no counter is lost, every later grant sees it);
8. ``rejoin_delay``: a node that lost its data (a restart without persistence, detected by a
   marker key that vanished) does not count towards a majority until that long after it was
   first seen empty.

Each node is spoken to over ONE pipelined connection (:class:`~._redis_wire.Link`, shared with
the Redis backend): requests are written
in order and the replies matched in order, so a fan-out costs one write per node and one
wake-up of the caller, not a task and a pooled connection per node; and every request to a
node runs after the ones sent before it (an attempt's clean-up can never overtake the
attempt, even on a node that was paused in between).  A request that is not answered in
time is not cancelled on the wire: its reply is read and dropped when it comes.

See ``docs/backends/redlock.md`` for the guarantees and, above all, what is not safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, Self

import anyio
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, SSLConnection

from .._errors import BackendError, BackendTimeout, ConfigurationError, describe, translating
from .._types import LockStatus
from .._url import ParsedURL, take_bool, take_float, take_str
from .._wakeup import Reservations, Wakeup, WakeupBoard
from ._base import (
    Backend,
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LostCallback,
    Request,
    Waiter,
    monotonic,
)
from ._redis_scripts import (
    ABANDON,
    ALL_SCRIPTS,
    FORCE_RELEASE,
    RENEW,
    STATUS,
    LockKeys,
    Memo,
    Script,
    key_table,
)
from ._redis_wire import WIRE_ERRORS, Address, CallTemplate, Link, OnReply, ScriptCall, pack
from .redis import (
    PubSubHub,
    acquire_call,
    no_retry,
    release_calls,
    ssl_context_factory,
    take_ssl_options,
)

__all__ = ["RAISE_COUNTER", "REJOIN", "RedlockBackend"]

log = logging.getLogger("aiodlock")

DEFAULT_PORT: Final = 6379
#: ``node_timeout`` when not given: ``min(50 ms, ttl / 100)`` but at least this.
MIN_NODE_TIMEOUT: Final = 0.01
MAX_AUTO_NODE_TIMEOUT: Final = 0.05
#: Added to ``ttl * drift_factor`` (the Redlock paper's 2 ms for the timer resolution).
DRIFT_FLOOR: Final = 0.002

# -- the two scripts Redlock adds (the lock itself uses the shared ones) ----------------------

RAISE_COUNTER = Script(
    "raise_counter",
    """-- Raise a fencing counter to at least a token handed out by another node (Redlock).
-- KEYS[1] fencing counter
-- ARGV[1] the token
-- returns the counter after the call
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
  redis.call('SET', KEYS[1], ARGV[1])
  return wanted
end
return current
""",
)

REJOIN = Script(
    "rejoin",
    """-- When may this node's votes count?  (run on every new connection with rejoin_delay)
-- A marker key holds the server time (ms) from which the node counts.  A node that lost its
-- data (restarted without persistence, flushed) has no marker: it counts only rejoin_delay
-- after the first client saw it empty, when every lease it may have forgotten has ended.
-- KEYS[1] marker
-- ARGV[1] rejoin delay in ms
-- returns ms until the node counts (0 or less: now)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local from = redis.call('GET', KEYS[1])
if not from then
  from = now + tonumber(ARGV[1])
  redis.call('SET', KEYS[1], from)
end
return tonumber(from) - now
""",
)

_SCRIPTS: Final = (*ALL_SCRIPTS, RAISE_COUNTER)


def _take_passwords(options: dict[str, Any], nodes: int) -> tuple[str | None, ...] | None:
    """The ``passwords`` option: one password (or None) per node, in the URL's order.

    A keyword argument only (a list): a query parameter would put every secret in the URL.
    """
    value = options.pop("passwords", None)
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ConfigurationError(
            "option 'passwords' needs a list with one password (or None) per node, in the "
            "URL's order, given as a keyword argument (not in the URL)"
        )
    if len(value) != nodes:
        raise ConfigurationError(
            f"option 'passwords' has {len(value)} entries for {nodes} nodes: give one per "
            f"node, in the URL's order (None for a node without a password)"
        )
    for item in value:
        if item is not None and not isinstance(item, str):
            raise ConfigurationError(
                f"option 'passwords' needs strings (or None), got a {type(item).__name__}"
            )
    return tuple(value)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.5))


# --------------------------------------------------------------------------------------------
# one node
# --------------------------------------------------------------------------------------------


class _Node:
    """One Redis master: its pipelined link, its pub/sub hub, its standing."""

    __slots__ = (
        "_silent",
        "address",
        "counts_after",
        "hub",
        "index",
        "label",
        "link",
        "pool",
        "secrets",
    )

    def __init__(self, index: int, address: str, secrets: tuple[str, ...]) -> None:
        self.index = index
        self.address = address
        self.secrets = secrets
        self.label = f"redlock node {address}"
        #: Monotonic time from which this node's votes count (``rejoin_delay``).
        self.counts_after = -math.inf
        self.link: Link
        self.pool: aioredis.ConnectionPool
        self.hub: PubSubHub
        self._silent: Memo[tuple[str, float], BackendTimeout] = Memo(self._silence, limit=64)

    def counts(self, now: float) -> bool:
        return now >= self.counts_after

    def no_answer(self, what: str, timeout: float) -> BackendTimeout:
        """The outcome of a request this node did not answer in time (never raised here).

        NOTE: made once per kind: a fan-out that is decided by a majority leaves the slower
        nodes "unanswered" on every lock operation, and formatting a new exception each time
        is a measurable part of an uncontended acquire.
        """
        return self._silent((what, timeout))

    def _silence(self, kind: tuple[str, float]) -> BackendTimeout:
        return BackendTimeout(f"{self.label}: {kind[0]}: no answer within {kind[1]:g} s")

    @contextlib.contextmanager
    def translate(self, what: str) -> Iterator[None]:
        """The one place where this node's failures become aiodlock's exceptions."""
        with translating(self.label, WIRE_ERRORS, what=what, secrets=self.secrets):
            yield

    def error(self, exc: BaseException, what: str) -> BackendError:
        """``exc`` as :meth:`translate` maps it."""
        try:
            with self.translate(what):
                raise exc
        except BackendError as mapped:
            return mapped
        except BaseException as other:  # pragma: no cover - not a node failure
            return BackendError(f"{self.label}: {what} failed: {describe(other)}")
        raise AssertionError("unreachable")  # pragma: no cover

    def __repr__(self) -> str:
        return f"<redlock node {self.index} {self.address}>"


# --------------------------------------------------------------------------------------------
# waiting
# --------------------------------------------------------------------------------------------


class _Local:
    """What this process knows about one name (keyed by the name's channel)."""

    __slots__ = ("attempts", "holder", "holder_until", "missed")

    def __init__(self) -> None:
        self.holder: str | None = None  # a local owner holding it ...
        self.holder_until = 0.0  # ... until then (its validity)
        self.attempts = 0  # local attempts in flight
        self.missed = False  # a release message came while an attempt was in flight


class _Board(WakeupBoard):
    """The local waiters by name, woken by the pub/sub hubs of ALL nodes.

    A release is announced by every node that held the key, so one release arrives up to N
    times: a message wakes one waiter only when no wake-up is already on its way and no
    local attempt, hold or hand-off makes an attempt pointless right now.
    """

    def __init__(self, quiet: Callable[[str], bool]) -> None:
        super().__init__()
        self._quiet = quiet

    def pending(self, name: str) -> bool:
        slots = self._slots.get(name)
        return slots is not None and any(slot.event.is_set() for slot in slots.values())

    def wake_one(self, name: str) -> bool:
        if name not in self._slots or self.pending(name) or self._quiet(name):
            return False
        return super().wake_one(name)

    def wake_direct(self, name: str) -> bool:
        """Wake one waiter after a release by this process (no message needed)."""
        if self.pending(name):
            return False
        return super().wake_one(name)


class _RedlockWaiter(Waiter):
    """Sleeps until a release message, a random poll interval or the given timeout.

    After a split vote the owner pauses for a random time that wake-ups do not cut short
    (otherwise the contenders' clean-up messages would make them collide again at once).
    """

    __slots__ = ("_backend", "_key", "_slot", "listening_since", "woken")

    def __init__(self, backend: RedlockBackend, slot: Any, key: tuple[str, str]) -> None:
        self._backend = backend
        self._slot = slot
        self._key = key
        #: A wake-up was consumed and the attempt it calls for has not been made yet.
        self.woken = False
        #: Since when a majority of the nodes has the channel confirmed, as it was when the
        #: waiter entered (see the Waiter protocol; the random polling covers the rest).
        self.listening_since: float | None = None

    def _consume(self) -> bool:
        if not self._slot.event.is_set():
            return False
        self._slot.event = Wakeup()
        self.woken = True
        return True

    async def wait(self, timeout: float | None) -> bool:
        backend = self._backend
        slot = self._slot
        until = backend._not_before.get(self._key)
        if until is not None:
            pause = until - monotonic()
            if pause > 0:
                await asyncio.sleep(pause if timeout is None else min(pause, timeout))
                return self._consume()
        limit = backend._poll_interval()
        if timeout is not None:
            limit = min(limit, timeout)
        await slot.event.wait(limit)
        return self._consume()


class _Waiting:
    """:meth:`RedlockBackend.waiter`: one owner waiting for a name (a class, not generator
    context managers: every contended acquisition enters and leaves one).

    Entering takes a place on the board, then the name's channel on every node: it waits
    (briefly) until a majority of the nodes confirmed the subscription, since a holder's
    release reaches a majority, so at least one of its messages then reaches us.  Nodes
    that are down or slow are not waited for; their subscription completes (or not) in the
    background, and the waiter's random polling covers the rest.  Leaving undoes it all.
    """

    __slots__ = (
        "_backend",
        "_channel",
        "_entered",
        "_entering",
        "_key",
        "_request",
        "_slot",
        "_waiter",
    )

    def __init__(self, backend: RedlockBackend, request: Request) -> None:
        self._backend = backend
        self._request = request

    async def __aenter__(self) -> _RedlockWaiter:
        backend = self._backend
        channel = self._channel = backend.keys_for(self._request.name).channel
        ckey = channel.decode("latin-1")
        key = self._key = (ckey, self._request.owner)
        slot = self._slot = backend._board.add(ckey)
        self._waiter: _RedlockWaiter | None = None
        #: (hub, its channel state) subscribed, and (hub, task) still subscribing
        self._entered: list[tuple[PubSubHub, Any]] = []
        self._entering: list[tuple[PubSubHub, asyncio.Task[Any]]] = []
        try:
            nodes = backend.nodes
            for node in nodes:
                hub = node.hub
                if hub.is_ready(channel):
                    # (returns at once: already subscribed)
                    self._entered.append((hub, await hub.subscribe(channel)))
                else:
                    task = asyncio.get_running_loop().create_task(hub.subscribe(channel))
                    self._entering.append((hub, task))
            if self._entering:
                await backend._await_subscriptions(
                    nodes, channel, [task for _, task in self._entering]
                )
        except BaseException:
            self._leave()
            raise
        waiter = self._waiter = _RedlockWaiter(backend, slot, key)
        waiter.listening_since = backend._majority_since(channel)
        backend._waiters[key] = waiter
        return waiter

    async def __aexit__(self, *exc_info: object) -> None:
        backend = self._backend
        key = self._key
        if backend._waiters.get(key) is self._waiter:
            del backend._waiters[key]
        backend._not_before.pop(key, None)
        self._leave()

    def _leave(self) -> None:
        channel = self._channel
        for hub, state in self._entered:
            hub.leave(channel, state)
        for hub, task in self._entering:
            if task.done():
                if not task.cancelled() and task.exception() is None:
                    hub.leave(channel, task.result())
            else:
                # (a cancelled subscribe leaves by itself)
                task.cancel()
        self._backend._board.remove(self._slot)


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Settings:
    hosts: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    #: one password per node (URL order), when they differ; else None
    passwords: tuple[str | None, ...] | None = dataclasses.field(repr=False)
    node_timeout: float | None
    drift_factor: float
    retry_delay: float
    rejoin_delay: float
    tls: bool
    ssl: dict[str, Any]
    shown: str


@dataclasses.dataclass(slots=True)
class _GrantData:
    keys: LockKeys
    channel_key: str
    #: node index -> the token that node granted (its own INCR); ``ballot.tokens``
    tokens: dict[int, int]
    #: the lease's token (the largest of them)
    token: int
    #: the acquire's ballot (its replies still come in after the grant)
    ballot: _Votes


Outcome = Any
"""A node's answer in a fan-out: the decoded reply, or a :class:`BackendError` (a
:class:`BackendTimeout` when it did not answer in time)."""


class RedlockBackend(Backend):
    """Redlock: a lock is held when a majority of N independent Redis masters granted it.

    See ``docs/backends/redlock.md`` for the algorithm, its guarantees and its limits.
    """

    backend_name = "redlock"
    # NOTE: FENCING holds only under the conditions the docs list (no counter lost).
    capabilities = Capability.FENCING | Capability.CROSS_PROCESS

    def __init__(self, settings: _Settings, config: CommonConfig) -> None:
        self.settings = settings
        self.config = config
        self._namespace = config.namespace
        self.quorum = len(settings.hosts) // 2 + 1
        self._nodes: list[_Node] = []
        #: Per node, from when its votes count; None while every node counts (rejoin_delay)
        self._after: list[float] | None = None
        self._board = _Board(self._quiet)
        self._local: dict[str, _Local] = {}
        self._local_limit = 1024
        self._waiters: dict[tuple[str, str], _RedlockWaiter] = {}
        #: (channel key, owner) -> no attempt before then (the random pause of a split vote)
        self._not_before: dict[tuple[str, str], float] = {}
        #: channel key -> until when a local release reserves the next attempt for the
        #: local waiter it woke
        self._handoffs = Reservations(min(0.1, config.op_timeout))
        #: The rejoin marker (see REJOIN), one per namespace and node.
        self.marker = config.namespace.encode() + b":redlock:rejoin"
        every = (settings.password, *(settings.passwords or ()))
        self.secrets = tuple(p for p in every if p)
        self._patience = self.node_timeout(config.watchdog_ttl)
        #: timeout -> the fan-outs waiting that long (one loop timer per queue)
        self._queues: dict[float, _Expiries] = {}
        self._keys = key_table(config.namespace)
        #: (keys, owner, lease ms) -> the ACQUIRE call, packed once (an owner re-acquires)
        self._acquire_calls: Memo[tuple[LockKeys, str, int], ScriptCall] = Memo(acquire_call)
        #: (keys, owner) -> the RELEASE call, packed but for the token (it differs per node)
        self._release_calls: Memo[tuple[LockKeys, str], tuple[CallTemplate, ScriptCall]] = Memo(
            release_calls
        )

    # -- configuration ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        if not url.hosts:
            raise ConfigurationError(
                "a redlock:// URL lists the Redis masters: 'redlock://h1:6379,h2:6379,h3:6379'"
            )
        hosts = tuple(url.host_list(DEFAULT_PORT))
        seen: set[tuple[str, int]] = set()
        for host in hosts:
            if host in seen:
                raise ConfigurationError(
                    f"redlock:// lists {host[0]}:{host[1]} twice: every node must be a "
                    f"different Redis master"
                )
            seen.add(host)
        path = url.path.strip("/")
        if path and not path.isdigit():
            raise ConfigurationError(
                f"the redlock:// URL path must be a database number ('/0'), got {url.path!r}"
            )
        db = int(path) if path else 0
        password = take_str(options, "password", url.password, secret=True)
        passwords = _take_passwords(options, len(hosts))
        if passwords is not None and password is not None:
            raise ConfigurationError(
                "give either 'password' (the same on every node) or 'passwords' (one per "
                "node), not both"
            )
        username = take_str(options, "username", url.username)
        node_timeout = take_float(options, "node_timeout", None, allow_zero=False, allow_none=True)
        if node_timeout is not None and node_timeout * 2 > config.watchdog_ttl:
            raise ConfigurationError(
                f"option 'node_timeout' ({node_timeout:g} s) must be far below the lease "
                f"(watchdog_ttl = {config.watchdog_ttl:g} s): at most half of it"
            )
        drift_factor = take_float(options, "drift_factor", 0.01, minimum=0.0)
        assert drift_factor is not None
        if drift_factor >= 0.5:
            raise ConfigurationError(
                f"option 'drift_factor' must be below 0.5 (0.01 is usual), got {drift_factor!r}"
            )
        retry_delay = take_float(options, "retry_delay", 0.2, allow_zero=False)
        assert retry_delay is not None
        rejoin_delay = take_float(options, "rejoin_delay", 0.0, minimum=0.0)
        assert rejoin_delay is not None
        tls = take_bool(options, "ssl", False)
        ssl = take_ssl_options(options)
        if ssl and not tls:
            raise ConfigurationError(
                f"the option(s) {', '.join(sorted(ssl))} need ssl=True (TLS to every node)"
            )
        settings = _Settings(
            hosts=hosts,
            db=db,
            username=username,
            password=password,
            passwords=passwords,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            retry_delay=retry_delay,
            rejoin_delay=rejoin_delay,
            tls=tls,
            ssl=ssl,
            shown=url.redacted(),
        )
        return cls(settings, config)

    def describe(self) -> str:
        return self.settings.shown

    def node_timeout(self, ttl: float) -> float:
        """How long an acquire waits for one node's answer, for a lease of ``ttl`` seconds."""
        if self.settings.node_timeout is not None:
            return self.settings.node_timeout
        return max(MIN_NODE_TIMEOUT, min(MAX_AUTO_NODE_TIMEOUT, ttl / 100))

    def drift(self, ttl: float) -> float:
        """Clock drift allowance subtracted from a lease's validity."""
        return ttl * self.settings.drift_factor + DRIFT_FLOOR

    def _poll_interval(self) -> float:
        delay = self.settings.retry_delay
        return random.uniform(delay / 2, delay)

    @property
    def nodes(self) -> list[_Node]:
        """The nodes (after :meth:`open`), in URL order."""
        if not self._nodes:
            raise BackendError("redlock: the backend is not open")
        return self._nodes

    # -- lifecycle -------------------------------------------------------------------------

    def _build_node(self, index: int, host: str, port: int) -> _Node:
        s = self.settings
        password = s.password if s.passwords is None else s.passwords[index]
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        node = _Node(index, address, self.secrets)
        tls = ssl_context_factory(s.ssl) if s.tls else None
        node.link = Link(
            node.label,
            Address(host, port, tls=tls),
            connect_timeout=self.config.connect_timeout,
            op_timeout=self.config.op_timeout,
            username=s.username,
            password=password,
            db=s.db,
            scripts=_SCRIPTS,
            extra=self._rejoin_check if s.rejoin_delay > 0 else None,
            on_extra=functools.partial(self._rejoined, node),
        )
        # redis-py makes the pub/sub connections (PubSubHub speaks through them).
        tls_pool: dict[str, Any] = {}
        if s.tls:
            tls_pool = {"connection_class": SSLConnection, **s.ssl}
        node.pool = aioredis.ConnectionPool(
            **tls_pool,
            host=host,
            port=port,
            db=s.db,
            username=s.username,
            password=password,
            socket_timeout=None,
            socket_connect_timeout=self.config.connect_timeout,
            retry=no_retry(),
            health_check_interval=0,
        )

        async def connect() -> AbstractConnection:
            conn: AbstractConnection = node.pool.make_connection()  # type: ignore[no-untyped-call]
            try:
                await conn.connect()  # type: ignore[no-untyped-call]
            except BaseException:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                raise
            return conn

        node.hub = PubSubHub(
            connect,
            self._board,
            op_timeout=self.config.op_timeout,
            connect_timeout=self.config.connect_timeout,
            ping_interval=max(1.0, min(10.0, self.config.watchdog_ttl / 3)),
            label=node.label,
            secrets=self.secrets,
        )
        return node

    def _rejoin_check(self) -> list[bytes]:
        """The handshake's extra command with ``rejoin_delay``: the REJOIN script."""
        return [pack(b"EVAL", REJOIN.source, 1, self.marker, _ms(self.settings.rejoin_delay))]

    def _rejoined(self, node: _Node, replies: list[Any]) -> None:
        """The REJOIN script's answer: from when ``node``'s votes count."""
        if not replies:
            return
        left = replies[-1] if isinstance(replies[-1], int) else 0
        node.counts_after = monotonic() + max(0, left) / 1000
        delayed = [n.counts_after for n in self._nodes]
        self._after = delayed if max(delayed) > -math.inf else None
        if left > 0:
            log.warning(
                "aiodlock: %s has lost its data (restarted without persistence?); its "
                "votes count again in %.1f s (rejoin_delay)",
                node.label,
                left / 1000,
            )

    async def open(self, on_lost: LostCallback) -> None:
        self._after = None
        self._nodes = [
            self._build_node(i, host, port) for i, (host, port) in enumerate(self.settings.hosts)
        ]
        outcomes = await self._fan_out(
            self._nodes,
            lambda node, deliver: node.link.command((b"PING",), deliver),
            what="connect",
            timeout=self.config.connect_timeout * 0.9,
            patience=self._patience,
            vote=_answer,  # a majority is enough; the others go on connecting
        )
        answered = _answered(outcomes)
        if answered < self.quorum:
            raise BackendError(
                f"redlock: only {answered} of {len(self._nodes)} nodes answered, a majority "
                f"({self.quorum}) is needed: {self._errors(outcomes)}"
            )
        for node, outcome in zip(self._nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                reason = describe(outcome, self.secrets)
                log.warning("aiodlock: %s is not answering (yet): %s", node.label, reason)

    async def aclose(self) -> None:
        nodes, self._nodes = self._nodes, []
        for node in nodes:
            node.link.close()
        for node in nodes:
            await node.hub.aclose()
            with contextlib.suppress(Exception):
                await node.pool.disconnect()

    # -- fan-out ---------------------------------------------------------------------------

    async def _fan_out(
        self,
        nodes: Sequence[_Node],
        request: ScriptCall | Callable[[_Node, OnReply], None],
        *,
        what: str,
        timeout: float,
        patience: float | None = None,
        decided: Callable[[list[Any]], bool] | None = None,
        vote: Vote | None = None,
    ) -> list[Outcome]:
        """Send ``request(node, deliver)`` to every node at once; one :data:`Outcome` each.

        ``request`` may also be a :class:`ScriptCall`: every node runs that script.

        Waits until every node answered, at most ``timeout``.  With ``patience``, waits that
        long for all of them, then only until the fan-out is decided: by ``vote`` (a
        majority of the nodes said yes, or too many said no for a majority), or by
        ``decided(replies)`` (the replies so far: a reply, an exception or ``_NO_ANSWER``).
        A node that has not answered by then gets a :class:`BackendTimeout` (its reply is
        read and dropped when it comes).
        """
        gather = _Gather(len(nodes), vote, self.quorum if vote is not None else 0)
        if decided is not None:
            check = decided
            replies = gather.replies
            gather.check = lambda: check(replies)
            gather.decidable = True
        self._start_fan_out(nodes, request, gather)
        await self._finish_fan_out(gather, timeout=timeout, patience=patience)
        return self._outcomes(nodes, gather.replies, what, timeout)

    def _start_fan_out(
        self,
        nodes: Sequence[_Node],
        request: ScriptCall | list[ScriptCall] | Callable[[_Node, OnReply], None],
        gather: _Gather,
    ) -> None:
        """The sending half of a fan-out: node ``i`` of ``nodes`` answers to
        ``gather.deliver(i, reply)`` (nothing is awaited).

        ``request``: one script call for every node, a list of them (one per node), or
        ``request(node, deliver)`` sending whatever it likes.
        """
        deliver = gather.deliver
        if type(request) is ScriptCall:
            for index, node in enumerate(nodes):
                node.link.eval(request, functools.partial(deliver, index))
        elif type(request) is list:
            for index, node in enumerate(nodes):
                node.link.eval(request[index], functools.partial(deliver, index))
        else:
            assert callable(request)
            for index, node in enumerate(nodes):
                request(node, functools.partial(deliver, index))

    def _finish_fan_out(
        self, gather: _Gather, *, timeout: float, patience: float | None = None
    ) -> Awaitable[None]:
        """The waiting half: see :meth:`_fan_out` for ``timeout`` and ``patience``.

        (A plain function returning what to await: one coroutine less on every lock
        operation.)
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        if patience is None or patience >= timeout or not gather.decidable:
            return gather.until(self._expiries(loop, timeout), started + timeout, armed=False)
        if patience > 0:
            return self._patiently(gather, loop, started, patience, timeout)
        return gather.until(self._expiries(loop, timeout), started + timeout, armed=True)

    async def _patiently(
        self,
        gather: _Gather,
        loop: asyncio.AbstractEventLoop,
        started: float,
        patience: float,
        timeout: float,
    ) -> None:
        """Every answer for ``patience`` seconds, then only until decided."""
        await gather.until(self._expiries(loop, patience), started + patience, armed=False)
        await gather.until(self._expiries(loop, timeout), started + timeout, armed=True)

    def _expiries(self, loop: asyncio.AbstractEventLoop, timeout: float) -> _Expiries:
        """The queue of the fan-outs that wait ``timeout`` seconds at most."""
        queue = self._queues.get(timeout)
        if queue is None or queue.loop is not loop:
            if len(self._queues) > 64:  # (timeouts follow the lease lengths in use)
                self._queues = {t: q for t, q in self._queues.items() if q.entries}
            queue = self._queues[timeout] = _Expiries(loop)
        return queue

    def _outcomes(
        self, nodes: Sequence[_Node], replies: Sequence[Any], what: str, timeout: float
    ) -> list[Outcome]:
        out: list[Outcome] = []
        for node, reply in zip(nodes, replies, strict=True):
            if reply is _NO_ANSWER:
                # Not a failure of the driver: the node is slow, or the fan-out did not
                # need its answer (it comes later and is dropped).
                out.append(node.no_answer(what, timeout))
            elif isinstance(reply, BaseException):
                out.append(node.error(reply, what))
            else:
                out.append(reply)
        return out

    def _errors(self, outcomes: Sequence[Outcome]) -> str:
        parts = [
            describe(outcome, self.secrets)
            for outcome in outcomes
            if isinstance(outcome, BaseException)
        ]
        return "; ".join(parts) or "no error"

    # -- local state -----------------------------------------------------------------------

    def _quiet(self, channel_key: str) -> bool:
        """Is a release message on this channel of no use to local waiters right now?"""
        if self._handoffs.active(channel_key):
            return True  # a local release already woke a waiter
        now = monotonic()
        local = self._local.get(channel_key)
        if local is None:
            return False
        if local.attempts:
            local.missed = True  # wake one when the attempt fails
            return True
        return local.holder is not None and local.holder_until > now

    def _tidy(self, channel_key: str, local: _Local) -> None:
        # NOTE: an idle entry answers like a missing one, so it stays for the name's next
        # acquire (one object less per lock cycle) until there are many.
        if len(self._local) > self._local_limit:
            self._local = {k: v for k, v in self._local.items() if v.holder or v.attempts}
            self._local_limit = max(1024, 2 * len(self._local))

    def _forget_holder(self, channel_key: str, owner: str) -> None:
        local = self._local.get(channel_key)
        if local is not None and local.holder == owner:
            local.holder = None
            local.missed = False
            self._tidy(channel_key, local)

    # -- the protocol ----------------------------------------------------------------------

    def keys_for(self, name: str) -> LockKeys:
        """The keys and channels of lock ``name`` (the same on every node)."""
        return self._keys(name)

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        keys = self.keys_for(request.name)
        ckey = keys.channel_key
        owner = request.owner
        key = (ckey, owner)
        now = monotonic()
        local = self._local.get(ckey)
        if local is not None and local.holder not in (None, owner) and local.holder_until > now:
            # Another task of this process holds it: no need to ask the servers.
            return Busy(local.holder_until - now)
        handoff = False
        if will_wait:
            if self._not_before:
                until = self._not_before.get(key)
                if until is not None:
                    if until > now:
                        return Busy(until - now)
                    del self._not_before[key]
            waiter = self._waiters.get(key)
            woken = waiter is not None and waiter.woken
            if waiter is not None:
                waiter.woken = False
            if self._handoffs:
                # NOTE: do not barge past the waiter that a local release woke (the
                # releasing task asking again, typically); that waiter makes its attempt.
                left = self._handoffs.bar(ckey, woken)
                if left is not None:
                    return Busy(left)
                handoff = woken and ckey in self._handoffs
            if local is not None and local.attempts:
                # Two local owners cannot both win: they would only split the vote.  The
                # attempt in flight wakes a waiter if it fails after a release message came.
                return Busy(None)
        if local is None:
            local = self._local[ckey] = _Local()
        local.attempts += 1
        granted = False
        try:
            result = await self._attempt(keys, ckey, request, will_wait)
            if isinstance(result, Grant):
                granted = True
                local.holder = owner
                assert result.expires_at is not None
                local.holder_until = result.expires_at
            return result
        finally:
            if handoff:
                self._handoffs.end(ckey)
            local.attempts -= 1
            if local.missed and not local.attempts:
                local.missed = False
                if not granted:
                    self._board.wake_direct(ckey)
            self._tidy(ckey, local)

    async def _attempt(
        self, keys: LockKeys, ckey: str, request: Request, will_wait: bool
    ) -> Grant | Busy:
        nodes = self.nodes
        owner = request.owner
        ttl = request.ttl
        timeout = self.node_timeout(ttl)
        quorum = self.quorum
        started = monotonic()
        ballot = _Votes(len(nodes), quorum, acquire=True, after=self._after)
        # NOTE: a majority of yes is enough: the other nodes' answers still come (in order
        # on their connections, before any later request of ours there).
        self._start_fan_out(nodes, self._acquire_calls((keys, owner, _ms(ttl))), ballot)
        await self._finish_fan_out(ballot, timeout=timeout, patience=0.0)
        drift = self.drift(ttl)
        tokens = ballot.tokens
        assert tokens is not None  # (an acquire's)
        if ballot.yes >= quorum and monotonic() - started + drift < ttl:
            token = max(tokens.values())
            level = min(tokens.values()) == token or await self._raise_counters(
                keys, tokens, token, timeout
            )
            if level and monotonic() - started + drift < ttl:
                # NOTE: the ballot's own tokens: a node that grants after the vote adds its
                # token there, and the release and renewals then send it that token.
                data = _GrantData(keys, ckey, tokens, token, ballot)
                return Grant(request.name, owner, token, started + ttl - drift, data)
        outcomes = self._outcomes(nodes, ballot.replies, "acquire", timeout)
        busy_pttls: list[int] = []
        busy_nodes: set[int] = set()
        failed = 0
        broken = 0
        for node, outcome in zip(nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed += 1
                if not isinstance(outcome, TimeoutError):
                    broken += 1
            else:
                granted, value = _acquire_reply(outcome)
                if not granted:
                    busy_nodes.add(node.index)
                    busy_pttls.append(value)
        # Not held: undo it wherever it may have been set (every node that did not say no).
        # NOTE: on each node the undo runs after the attempt (same connection, in order),
        # even where the attempt's answer is still on its way.
        undo = [node for node in nodes if node.index not in busy_nodes]
        if undo:
            await self._undo(keys, owner, undo)
        if broken > len(nodes) - quorum:
            # NOTE: only failures that a second attempt at once will not cure (refused
            # connections, errors): timeouts are retried, as a stall of this process makes
            # every node "time out".
            error = BackendError(
                f"redlock: {broken} of {len(nodes)} nodes failed on {request.name!r}, so no "
                f"majority ({quorum}) is possible: {self._errors(outcomes)}"
            )
            # Nodes that cannot be reached (restarting, say) may come back: a waiting
            # acquire then tries again for a while (the core bounds it, see _waiting).
            error.transient = all(
                isinstance(o, BackendError) and o.transient
                for o in outcomes
                if isinstance(o, BaseException) and not isinstance(o, TimeoutError)
            )
            raise error
        if len(busy_nodes) >= quorum:
            # Held by someone: wake when enough of the holder's keys would have expired.
            pttls = sorted(p for p in busy_pttls if p >= 0)
            needed = max(1, quorum - (len(nodes) - len(busy_nodes) - failed))
            return Busy(pttls[needed - 1] / 1000 if len(pttls) >= needed else None)
        # A split vote (or nodes not counted yet): try again after a random pause.
        pause = random.uniform(0.0, self.settings.retry_delay)
        if will_wait:
            self._not_before[(ckey, owner)] = monotonic() + pause
            if len(self._not_before) > 4096:
                self._prune_pauses()
        return Busy(pause)

    def _prune_pauses(self) -> None:
        now = monotonic()
        for key, until in list(self._not_before.items()):
            if until <= now:
                del self._not_before[key]

    async def _raise_counters(
        self, keys: LockKeys, tokens: dict[int, int], token: int, timeout: float
    ) -> bool:
        """Raise the lagging counters of the granting nodes to ``token``.

        True when a majority of counted nodes is then at ``token`` or above, so every later
        grant (whose majority shares a node with this one) gets a larger token.
        """
        nodes = self.nodes
        lagging = [nodes[i] for i, t in tokens.items() if t < token]
        call = ScriptCall(RAISE_COUNTER, (keys.counter,), (token,))
        outcomes = await self._fan_out(
            lagging,
            call,
            what="raise the fencing counter",
            timeout=timeout,
        )
        now = monotonic()
        level = sum(1 for i, t in tokens.items() if t >= token and nodes[i].counts(now))
        for node, outcome in zip(lagging, outcomes, strict=True):
            if not isinstance(outcome, BaseException) and node.counts(now):
                level += 1
        return level >= self.quorum

    async def _undo(self, keys: LockKeys, owner: str, nodes: Sequence[_Node]) -> list[Outcome]:
        """Remove ``owner``'s keys from ``nodes``, all at once."""
        call = ScriptCall(
            ABANDON,
            (keys.lock, keys.queue, keys.deadlines),
            (owner, keys.channel, keys.waiter_prefix),
        )
        return await self._fan_out(
            nodes,
            call,
            what="abandon",
            timeout=self.config.op_timeout,
            patience=self._patience,
            decided=lambda outcomes: True,
        )

    def waiter(self, request: Request) -> contextlib.AbstractAsyncContextManager[Waiter]:
        return _Waiting(self, request)

    def _majority_since(self, channel: bytes) -> float | None:
        """Since when a majority of the nodes has ``channel`` confirmed without a break."""
        since = sorted(
            t for t in (node.hub.ready_since(channel) for node in self.nodes) if t is not None
        )
        return since[self.quorum - 1] if len(since) >= self.quorum else None

    async def _await_subscriptions(
        self, nodes: Sequence[_Node], channel: bytes, tasks: list[asyncio.Task[Any]]
    ) -> None:
        deadline = monotonic() + min(self.config.op_timeout, max(0.25, 5 * self._patience))
        pending = set(tasks)
        while pending:
            if sum(1 for node in nodes if node.hub.is_ready(channel)) >= self.quorum:
                return
            left = deadline - monotonic()
            if left <= 0:
                return
            _, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        if not grants:
            return []
        nodes = self.nodes
        data = [_data(g) for g in grants]
        lease_ms = _ms(ttl)
        quorum = self.quorum
        n = len(nodes)

        made: dict[tuple[int, int | str], ScriptCall] = {}

        def calls(node: _Node) -> list[ScriptCall]:
            out = []
            for i, (g, d) in enumerate(zip(grants, data, strict=True)):
                token: int | str = d.tokens.get(node.index, "")
                call = made.get((i, token))
                if call is None:
                    call = made[(i, token)] = ScriptCall(
                        RENEW, (d.keys.lock,), (g.owner, token, lease_ms)
                    )
                out.append(call)
            return out

        def tally(outcomes: list[Any], now: float) -> tuple[list[int], list[int]]:
            yes = [0] * len(grants)
            unknown = [0] * len(grants)
            for node, outcome in zip(nodes, outcomes, strict=True):
                if not isinstance(outcome, list):  # failed, or no answer (yet)
                    for i in range(len(grants)):
                        unknown[i] += 1
                elif node.counts(now):
                    for i, ok in enumerate(outcome):
                        if ok == 1:
                            yes[i] += 1
            return yes, unknown

        def decided(replies: list[Any]) -> bool:
            yes, unknown = tally(replies, monotonic())
            return all(y >= quorum or y + u < quorum for y, u in zip(yes, unknown, strict=True))

        started = monotonic()
        outcomes = await self._fan_out(
            nodes,
            lambda node, deliver: node.link.eval_many(calls(node), deliver),
            what="renew",
            timeout=self.config.op_timeout * 0.8,
            patience=0.0,
            decided=decided,
        )
        now = monotonic()
        yes, unknown = tally(outcomes, now)
        drift = self.drift(ttl)
        valid = now - started + drift < ttl
        results: list[float | None] = []
        undecided = 0
        for i, (grant, d) in enumerate(zip(grants, data, strict=True)):
            if yes[i] >= quorum and valid:
                expires_at = started + ttl - drift
                results.append(expires_at)
                local = self._local.get(d.channel_key)
                if local is not None and local.holder == grant.owner:
                    local.holder_until = expires_at
            elif yes[i] + unknown[i] < quorum or not valid:
                results.append(None)
                self._forget_holder(d.channel_key, grant.owner)
            else:
                undecided += 1
                results.append(None)
        if undecided:
            raise BackendError(
                f"redlock: renewing {undecided} of {len(grants)} lease(s) reached fewer than "
                f"{quorum} of {n} nodes: {self._errors(outcomes)}"
            )
        return results

    async def release(self, grant: Grant) -> bool:
        return await self.start_release(grant)

    def start_release(self, grant: Grant) -> Awaitable[bool]:
        # The requests leave at once (pipelined links); the core's bookkeeping then runs
        # while the nodes work.
        nodes = self._nodes
        d = grant.data
        if not nodes or not isinstance(d, _GrantData):
            return self._release_failed(grant)
        template, anyone = self._release_calls((d.keys, grant.owner))
        tokens = d.tokens
        token = d.token
        common = template.fill(token)
        request: ScriptCall | list[ScriptCall] = common
        if len(tokens) < len(nodes) or d.ballot.mixed:
            request = []
            for index in range(len(nodes)):
                mine = tokens.get(index)
                if mine is None:
                    request.append(anyone)  # (it may have granted after the vote: any token)
                elif mine == token:
                    request.append(common)
                else:
                    request.append(template.fill(mine))  # (a lagging counter, raised since)
        tally = _Votes(len(nodes), self.quorum, acquire=False)
        self._start_fan_out(nodes, request, tally)
        return self._finish_release(grant, d, tally)

    async def _release_failed(self, grant: Grant) -> bool:
        _data(grant)  # TypeError for a grant of another backend
        raise BackendError("redlock: the backend is not open")

    async def _finish_release(self, grant: Grant, d: _GrantData, tally: _Votes) -> bool:
        try:
            await self._finish_fan_out(tally, timeout=self.config.op_timeout, patience=0.0)
        finally:
            self._forget_holder(d.channel_key, grant.owner)
            if self._board.count(d.channel_key):
                # Wake a local waiter at once (no need to wait for a message) and reserve
                # the next attempt for it: the releasing task must not barge back in.
                self._board.wake_direct(d.channel_key)
                self._handoffs.reserve(d.channel_key)
        if tally.yes >= tally.need:
            return True
        n = len(tally.replies)
        if tally.no > n - tally.need:
            return False
        outcomes = self._outcomes(self.nodes, tally.replies, "release", self.config.op_timeout)
        raise BackendError(
            f"redlock: the release of {grant.name!r} reached only {tally.yes + tally.no} of "
            f"{n} nodes ({tally.yes} released); the rest expires with the lease: "
            f"{self._errors(outcomes)}"
        )

    async def abandon(self, request: Request) -> None:
        keys = self.keys_for(request.name)
        ckey = keys.channel.decode("latin-1")
        owner = request.owner
        self._not_before.pop((ckey, owner), None)
        try:
            outcomes = await self._undo(keys, owner, self.nodes)
        finally:
            self._forget_holder(ckey, owner)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise BackendError(
                f"redlock: could not clean up {request.name!r} on {len(failed)} node(s) yet "
                f"(what is left there expires with its lease): {self._errors(outcomes)}"
            )

    async def status(self, name: str) -> LockStatus | None:
        keys = self.keys_for(name)
        nodes = self.nodes
        call = ScriptCall(STATUS, (keys.lock, keys.deadlines), ())
        outcomes = await self._fan_out(
            nodes,
            call,
            what="status",
            timeout=self.config.op_timeout,
            patience=self._patience,
            vote=_answer,
        )
        if _answered(outcomes) < self.quorum:
            raise BackendError(
                f"redlock: only {_answered(outcomes)} of {len(nodes)} nodes answered: "
                f"{self._errors(outcomes)}"
            )
        holders: dict[str, list[tuple[int, int]]] = {}
        for outcome in outcomes:
            if outcome and not isinstance(outcome, BaseException):
                raw_owner, token, pttl = outcome[0], int(outcome[1]), int(outcome[2])
                owner = raw_owner.decode("utf-8", "surrogateescape")
                holders.setdefault(owner, []).append((token, pttl))
        for owner, held in holders.items():
            if len(held) >= self.quorum:
                token = max(t for t, _ in held)
                # The lease lasts while a majority of its keys do.
                pttls = sorted((p for _, p in held), reverse=True)
                left = pttls[self.quorum - 1]
                return LockStatus(name, owner, token, left / 1000 if left >= 0 else None, None)
        return None

    async def force_release(self, name: str) -> bool:
        keys = self.keys_for(name)
        nodes = self.nodes
        call = ScriptCall(
            FORCE_RELEASE,
            (keys.lock, keys.queue, keys.deadlines),
            (keys.channel, keys.waiter_prefix),
        )
        outcomes = await self._fan_out(
            nodes,
            call,
            what="force_release",
            timeout=self.config.op_timeout,
            patience=self._patience,
            vote=_answer,
        )
        if _answered(outcomes) < self.quorum:
            raise BackendError(
                f"redlock: force_release of {name!r} reached only {_answered(outcomes)} of "
                f"{len(nodes)} nodes: {self._errors(outcomes)}"
            )
        return any(o == 1 for o in outcomes)


_NO_ANSWER: Final = object()


Vote = Callable[[int, Any], bool | None]
"""How one node's reply counts: yes (True), no (False) or neither (None)."""


class _Gather:
    """The replies of one fan-out, and the one future its caller sleeps on.

    With a ``vote``, replies are counted as they come: the fan-out is decided once ``need``
    nodes said yes or more than ``spare`` said no (a majority either way).  The subclasses
    below count the two hot fan-outs (acquire, release) inline, without a vote function.
    """

    __slots__ = (
        "armed",
        "check",
        "counted",
        "decidable",
        "left",
        "need",
        "no",
        "replies",
        "spare",
        "vote",
        "waiter",
        "yes",
    )

    def __init__(self, n: int, vote: Vote | None = None, need: int = 0) -> None:
        self.replies: list[Any] = [_NO_ANSWER] * n
        self.left = n
        self.waiter: asyncio.Future[None] | None = None
        self.check: Callable[[], bool] | None = None
        self.vote = vote
        #: Decided by the yes and no counts (else by ``check``, if any).
        self.counted = need > 0
        self.need = need
        self.spare = n - need
        self.yes = 0
        self.no = 0
        self.armed = False
        self.decidable = self.counted

    def deliver(self, index: int, reply: Any) -> None:
        if self.replies[index] is not _NO_ANSWER:
            return
        self.replies[index] = reply
        self.left -= 1
        vote = self.vote
        if vote is not None:
            counted = vote(index, reply)
            if counted is True:
                self.yes += 1
            elif counted is False:
                self.no += 1
        if self.waiter is not None:
            self._settle()

    def _settle(self) -> None:
        """Wake the caller if every node answered or (once armed) the fan-out is decided."""
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if not self.left:
            waiter.set_result(None)
        elif self.armed and (
            self.yes >= self.need or self.no > self.spare
            if self.counted
            else self.check is not None and self.check()
        ):
            waiter.set_result(None)  # decided (what enough() says, inline: every reply)

    def enough(self) -> bool:
        """Decided (once ``armed``: before, only every answer ends the wait)."""
        if not self.armed:
            return False
        if self.counted:
            return self.yes >= self.need or self.no > self.spare
        return self.check is not None and self.check()

    async def until(self, queue: _Expiries, deadline: float, *, armed: bool) -> None:
        """Until every node answered, the fan-out is decided (when ``armed``), or the loop
        time ``deadline`` (``queue`` wakes it then)."""
        self.armed = armed
        if not self.left:
            return
        if armed and (
            self.yes >= self.need or self.no > self.spare if self.counted else self.enough()
        ):
            return
        loop = queue.loop
        if deadline <= loop.time():
            return
        self.waiter = waiter = loop.create_future()
        queue.add(deadline, waiter)
        try:
            await waiter
        finally:
            self.waiter = None


class _Votes(_Gather):
    """The two hot fan-outs, counted inline as the replies come (no vote function).

    - An acquire's (``acquire=True``): a yes is a token (the ACQUIRE script's usual integer
      answer, >= 1) from a node whose votes count; every other answer is a no.  ``tokens``
      keeps the token of every node that granted (counted or not).
    - A release's: 1 (released) is a yes, 0 (not ours) a no, a failure neither.

    NOTE: one class for both, not a subclass each: on Python 3.11 the attribute look-ups of
    shared methods lose their specialization when they see two classes in turn (a shared
    ``deliver`` calling a per-class judgement measured 5% more instructions per Redlock
    cycle than a ``deliver`` written out in each of two classes).
    """

    __slots__ = ("after", "first", "mixed", "tokens")

    def __init__(
        self, n: int, need: int, *, acquire: bool, after: Sequence[float] | None = None
    ) -> None:
        # (_Gather.__init__ written out: two of these are made per lock cycle)
        self.replies: list[Any] = [_NO_ANSWER] * n
        self.left = n
        self.waiter: asyncio.Future[None] | None = None
        self.check: Callable[[], bool] | None = None
        self.vote: Vote | None = None
        self.counted = self.decidable = True
        self.need = need
        self.spare = n - need
        self.yes = self.no = 0
        self.armed = False
        #: Per node, from when its votes count (``None``: every node counts).
        self.after = after
        #: An acquire's tokens by node (None for a release).
        self.tokens: dict[int, int] | None = {} if acquire else None
        #: The first token granted; did the nodes grant different tokens?
        self.first: int | None = None
        self.mixed = False

    def deliver(self, index: int, reply: Any) -> None:
        replies = self.replies
        if replies[index] is not _NO_ANSWER:
            return
        replies[index] = reply
        self.left -= 1
        tokens = self.tokens
        if tokens is None:  # a release
            if reply == 1:
                self.yes += 1
            elif reply == 0:
                self.no += 1
        else:  # an acquire
            if type(reply) is not int:
                # An older table answer (see _acquire_reply), an error or no connection.
                ok = not isinstance(reply, BaseException) and _acquire_reply(reply)[0]
                reply = _acquire_reply(reply)[1] if ok else 0
            if reply < 1:
                self.no += 1
            else:
                first = self.first
                if first is None:
                    self.first = reply
                elif reply != first:
                    self.mixed = True
                tokens[index] = reply
                after = self.after
                if after is None or after[index] <= monotonic():
                    self.yes += 1
                else:
                    self.no += 1
        waiter = self.waiter
        if (
            waiter is not None
            and (not self.left or (self.armed and (self.yes >= self.need or self.no > self.spare)))
            and not waiter.done()
        ):
            waiter.set_result(None)


class _Expiries:
    """Wakes the fan-outs of one timeout when their time is up, with ONE loop timer.

    A timer per fan-out (armed, then cancelled when the nodes answer a fraction of a
    millisecond later) costs a heap push and a cancellation on every lock operation.  The
    fan-outs of one timeout expire in the order they started, so a FIFO of their deadlines
    and futures is enough: the timer is armed for the oldest one still waiting, and one
    timer then serves every fan-out of a whole ``timeout`` window.
    """

    __slots__ = ("entries", "handle", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: collections.deque[tuple[float, asyncio.Future[None]]] = collections.deque()
        self.handle: asyncio.TimerHandle | None = None

    def add(self, deadline: float, waiter: asyncio.Future[None]) -> None:
        entries = self.entries
        # Fan-outs end about in the order they start: drop the finished ones at the front
        # (a long wait at the front makes the rest pile up: sweep them now and then).
        while entries and entries[0][1].done():
            entries.popleft()
        if len(entries) >= 1024:
            self.entries = entries = collections.deque(e for e in entries if not e[1].done())
        entries.append((deadline, waiter))
        if self.handle is None:
            self.handle = self.loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self.handle = None
        now = self.loop.time()
        entries = self.entries
        while entries:
            deadline, waiter = entries[0]
            if not waiter.done():
                if deadline > now:
                    self.handle = self.loop.call_at(deadline, self._fire)
                    return
                waiter.set_result(None)
            entries.popleft()


def _answer(index: int, reply: Any) -> bool | None:
    """Any answer counts: status and force_release need a majority of answers."""
    return None if isinstance(reply, BaseException) else True


def _acquire_reply(reply: Any) -> tuple[bool, int]:
    """The ACQUIRE script's answer: ``(True, token)`` or ``(False, ms left on the holder's
    lease, -1 when unknown)``.

    NOTE: the script answers ``token`` (>= 1), ``-1 - pttl`` or ``0`` (see its header in
    ``_redis_scripts``); the older ``{1, token}`` / ``{0, pttl}`` tables are read too.
    """
    if isinstance(reply, list):
        return reply[0] == 1, int(reply[1])
    value = int(reply)
    if value >= 1:
        return True, value
    return False, -1 - value if value < 0 else -1


def _answered(replies: Sequence[Any]) -> int:
    """How many nodes answered (replies or outcomes: failures and silence do not count)."""
    return sum(1 for r in replies if r is not _NO_ANSWER and not isinstance(r, BaseException))


def _data(grant: Grant) -> _GrantData:
    data = grant.data
    if not isinstance(data, _GrantData):
        raise TypeError(f"not a redlock grant: {grant!r}")
    return data
