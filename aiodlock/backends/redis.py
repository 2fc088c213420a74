"""``redis://``, ``rediss://``, ``unix://``, Sentinel and Cluster: Redisson's RLock in asyncio.

The protocol (key layout and Lua scripts) lives in :mod:`aiodlock.backends._redis_scripts`.
This module has three parts, the first two reusable by the Redlock backend:

* :class:`RedisNode`: the lock protocol on ONE Redis deployment through one redis.asyncio
  client (a server, a Sentinel-managed master, or a Cluster): ``acquire`` / ``renew``
  (pipelined) / ``release`` / ``abandon`` / ``status`` / ``force_release``, each one round
  trip, scripts run by EVALSHA with NOSCRIPT handled, every call bounded and its errors
  translated in one place;
* :class:`PubSubHub`: one pub/sub connection shared by every waiter of a backend, subscribed
  to a channel while this process has waiters on it, restored (and its waiters woken) after
  a reconnect, and health-checked with PING;
* :class:`RedisBackend`: the :class:`~aiodlock.backends._base.Backend` on top of them.

For Redlock (N independent masters): build one client per node with
:func:`connection_kwargs`, wrap each in a :class:`RedisNode` (``label="redlock h:p"``; its
methods take a per-call ``timeout``; pass ``token=""`` to release/renew by owner only, since
the nodes' tokens differ), give each node a :class:`PubSubHub` (connections from
:func:`open_pubsub_connection`) that all share one :class:`~aiodlock._waiting.WakeupBoard`,
and wait with a :class:`HubWaiter` whose ``listening()`` looks at those hubs.

Redis' own retries are off everywhere (``Retry(NoBackoff(), 0)``): the core owns the retry
policy, and an attempt by an owner who already holds the name is idempotent on the server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Literal, Self, TypeAlias

import anyio
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, RedisSSLContext
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import BackendError, ConfigurationError, describe, translating
from .._types import LockStatus
from .._url import ParsedURL, take_bool, take_float, take_int, take_str
from .._wakeup import Backoff, Reservations, Wakeup, WakeupBoard
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
    ACQUIRE,
    ACQUIRE_FAIR,
    ALL_SCRIPTS,
    FORCE_RELEASE,
    RELEASE,
    RELEASE_TRANSFER,
    RENEW,
    STATUS,
    LockKeys,
    Memo,
    Script,
    key_table,
)
from ._redis_wire import (
    Address,
    CallTemplate,
    Link,
    ReplyError,
    ScriptCall,
    pack,
    resolver,
)

__all__ = [
    "Deadlines",
    "HubWaiter",
    "LockKeys",
    "PubSubHub",
    "RedisBackend",
    "RedisNode",
    "connection_kwargs",
    "no_retry",
    "open_pubsub_connection",
    "take_ssl_options",
]

log = logging.getLogger("aiodlock")

AnyRedis: TypeAlias = "aioredis.Redis | RedisCluster"

_ERRORS: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, ReplyError)
_TIMEOUTS: tuple[type[BaseException], ...] = (RedisTimeoutError,)
#: Failures that time cures: the server unreachable or gone, loading its data after a
#: restart, read-only or down while a failover runs, a Cluster slot moving or uncovered.
#: (An AuthenticationError, a ConnectionError to redis-py, is translated before these.)
_TRANSIENT: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
)

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379


def no_retry() -> Retry:
    """A redis-py retry policy that never retries (the core owns retries)."""
    return Retry(NoBackoff(), 0)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.5))


# --------------------------------------------------------------------------------------------
# one deployment
# --------------------------------------------------------------------------------------------


class _Deadline:
    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.cancelling = task.cancelling()
        self.expired = False


class Deadlines:
    """Bounds any number of concurrent calls with ONE loop timer.

    ``asyncio.timeout()`` arms and cancels a timer per call, which costs more than a tenth of
    a loopback round trip through redis-py; here a call only registers its deadline, and a
    single timer (re-armed for the earliest deadline when it fires) cancels overdue calls.
    :meth:`leave` turns that cancellation into :class:`TimeoutError` with the same
    ``uncancel()`` bookkeeping as ``asyncio.timeout()``, so an outside cancellation is never
    mistaken for a timeout.
    """

    __slots__ = ("_active", "_handle", "_when")

    def __init__(self) -> None:
        self._active: set[_Deadline] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._when = 0.0

    def enter(self, timeout: float) -> _Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("aiodlock: redis calls must run inside an asyncio task")
        loop = task.get_loop()
        entry = _Deadline(task, loop.time() + timeout)
        self._active.add(entry)
        if self._handle is None or entry.deadline < self._when:
            self._arm(loop, entry.deadline)
        return entry

    def leave(self, entry: _Deadline, exc: BaseException | None) -> bool:
        """Unregister; True when ``exc`` is the cancellation this timer caused."""
        self._active.discard(entry)
        if not entry.expired:
            return False
        return entry.task.uncancel() <= entry.cancelling and isinstance(exc, asyncio.CancelledError)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._when = when
        self._handle = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        now = loop.time()
        earliest: float | None = None
        for entry in self._active:
            if entry.expired:
                continue
            if entry.deadline <= now:
                entry.expired = True
                entry.task.cancel("aiodlock: the call ran past op_timeout")
            elif earliest is None or entry.deadline < earliest:
                earliest = entry.deadline
        if earliest is not None:
            self._arm(loop, earliest)


def _ignore_result(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _wire_reply(reply: Any, *, raise_errors: bool) -> Any:
    """A reply from the link as redis-py would give it: an error reply becomes redis-py's
    exception (``NoScriptError``, ``ResponseError``...), raised or returned."""
    if isinstance(reply, BaseException):
        if isinstance(reply, ReplyError):
            reply = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]
        if raise_errors or not isinstance(reply, ResponseError):
            raise reply
    return reply


class _Connections:
    """Connections borrowed from a redis.asyncio pool and reused, last in first out.

    Our calls are single commands or pipelines that we send and read ourselves, so the
    pool's per-command bookkeeping is not needed: this saves about a quarter of a round
    trip's client-side cost.  A connection that failed was disconnected by redis-py; it is
    connected again (through Sentinel, if that is how the pool finds its server) before it
    is used again, and one that has unread data or was closed by the server is reset first,
    as the pool would.
    """

    __slots__ = ("_idle", "_pool")

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._idle: list[AbstractConnection] = []

    async def _take(self) -> AbstractConnection:
        idle = self._idle
        if not idle:
            conn: AbstractConnection = await self._pool.get_connection()
            return conn
        conn = idle.pop()
        try:
            if conn.is_connected:
                try:
                    stale = await conn.can_read()
                except (RedisError, OSError):
                    stale = True
                if stale:
                    await conn.disconnect(nowait=True)
            if not conn.is_connected:
                # NOTE: connect() (not the implicit connect of a send) is what asks
                # Sentinel for the current master.
                await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            idle.append(conn)
            raise
        return conn

    async def call(self, args: Sequence[Any]) -> Any:
        conn = await self._take()
        try:
            await conn.send_packed_command(conn.pack_command(*args), check_health=False)
            return await conn.read_response()
        except (RedisConnectionError, OSError):
            self.reset()  # the others most likely lead to the same dead server
            raise
        finally:
            # NOTE: on any failure (a cancellation included) redis-py has disconnected the
            # connection already, so no reply can be left unread on it.
            self._idle.append(conn)

    def reset(self) -> None:
        """Close the idle connections (after a failure, a reconnect, a failover)."""
        idle, self._idle = self._idle, []
        if idle:
            task = asyncio.get_running_loop().create_task(self._give_back(idle))
            task.add_done_callback(_ignore_result)

    async def _give_back(self, conns: list[AbstractConnection]) -> None:
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            with contextlib.suppress(Exception):
                await self._pool.release(conn)

    async def batch(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send every command at once, read every reply (a ResponseError is a reply)."""
        conn = await self._take()
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:
                    replies.append(exc)
            return replies
        except (RedisConnectionError, OSError):
            self.reset()
            raise
        finally:
            self._idle.append(conn)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await self._pool.release(conn)


class RedisNode:
    """The lock protocol on one Redis deployment, through one redis.asyncio client.

    Every method is ONE round trip (a NOSCRIPT reply costs a second one, once per script and
    server), bounded by ``timeout`` (default ``op_timeout``), and raises only
    :class:`~aiodlock.BackendError` / :class:`~aiodlock.BackendTimeout`.

    ``sync_replicas=N`` sends ``WAIT N sync_timeout`` after the acquire script in the same
    round trip: a grant that fewer than N replicas acknowledged in time is released again
    and reported as a :class:`~aiodlock.BackendError`.
    """

    def __init__(
        self,
        client: AnyRedis,
        *,
        op_timeout: float,
        label: str = "redis",
        secrets: tuple[str, ...] = (),
        sync_replicas: int = 0,
        sync_timeout: float = 1.0,
        link: Link | None = None,
    ) -> None:
        self.client = client
        self.is_cluster = isinstance(client, RedisCluster)
        self.op_timeout = op_timeout
        self.label = label
        self.sync_replicas = sync_replicas
        self.sync_timeout_ms = _ms(sync_timeout)
        self._secrets = tuple(s for s in secrets if s)
        #: The pipelined connection that carries every command (one server, no Sentinel,
        #: no WAIT), else None: commands go through redis-py's connections.
        self.link = link
        #: The hot calls, packed once (see acquire_call and release_calls).
        self._acquire_calls: Memo[tuple[LockKeys, str, int], ScriptCall] = Memo(acquire_call)
        self._release_calls: Memo[tuple[LockKeys, str], tuple[CallTemplate, ScriptCall]] = Memo(
            release_calls
        )
        self._transfer_calls: Memo[tuple[LockKeys, str, str, int], CallTemplate] = Memo(
            transfer_template
        )
        self._conns = (
            None
            if link is not None or isinstance(client, RedisCluster)
            else _Connections(client.connection_pool)
        )
        self._deadlines = Deadlines()
        #: Round trips started (a pipeline counts once): for tests and curious users.
        self.round_trips = 0

    async def aclose(self) -> None:
        """Close the link, give borrowed connections back to the client's pool (the client
        stays open)."""
        if self.link is not None:
            self.link.close()
        if self._conns is not None:
            await self._conns.aclose()

    def reset_connections(self) -> None:
        """Drop idle connections (the server behind them changed or went away).

        (The link needs no reset: it notices a broken connection itself and its server
        cannot change.)
        """
        if self._conns is not None:
            self._conns.reset()

    async def _call(self, *args: Any) -> Any:
        if self.link is not None:
            return _wire_reply(await self.link.call(pack(*args)), raise_errors=True)
        if self._conns is not None:
            return await self._conns.call(args)
        return await self.client.execute_command(*args)

    async def _batch(
        self, commands: Sequence[Sequence[Any]], *, wait_node: ClusterNode | None = None
    ) -> list[Any]:
        link = self.link
        if link is not None:
            loop = asyncio.get_running_loop()
            futures = [loop.create_future() for _ in commands]
            link.send(b"".join(pack(*c) for c in commands), [resolver(f) for f in futures])
            return [_wire_reply(await f, raise_errors=False) for f in futures]
        if self._conns is not None:
            return await self._conns.batch(commands)
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            if wait_node is not None and command[0] == "WAIT":
                # NOTE: on a Cluster, WAIT must go to the slot's master, where the pipeline
                # sends the script before it on the same connection.
                pipe.execute_command(*command, target_nodes=wait_node)
            else:
                pipe.execute_command(*command)
        if not isinstance(self.client, RedisCluster):
            results: list[Any] = await pipe.execute(raise_on_error=False)
            return results
        try:
            results = await pipe.execute(raise_on_error=False)
        except RedisCluster.ERRORS_ALLOW_RETRY:
            await self._relearn_slots()
            raise
        if any(isinstance(r, RedisCluster.ERRORS_ALLOW_RETRY) for r in results):
            await self._relearn_slots()
        return results

    async def _relearn_slots(self) -> None:
        """Make the Cluster client read the slot map again before its next command.

        NOTE: a single command that fails to connect marks redis-py's cluster client for
        re-initialization, but a pipeline run with ``raise_on_error=False`` keeps the error
        as a reply and, with retries off, marks nothing: after a master died and its replica
        took over, every later pipeline (renewals, grants with ``sync_replicas``) would go
        on asking the dead node.  Closing the client's connections is redis-py's own way to
        force a new slot map (its pipeline retry and its CLUSTERDOWN handling do the same).
        """
        assert isinstance(self.client, RedisCluster)
        with contextlib.suppress(Exception):
            await self.client.aclose()

    def __repr__(self) -> str:
        return f"<RedisNode {self.label}>"

    @contextlib.contextmanager
    def translate(self, what: str) -> Iterator[None]:
        """The one place where redis-py's exceptions become aiodlock's."""
        with translating(
            self.label, _ERRORS, _TIMEOUTS, what=what, secrets=self._secrets, transient=_TRANSIENT
        ):
            try:
                yield
            except AuthenticationError as exc:
                raise BackendError(
                    f"{self.label}: {what} failed: authentication failed, check the username "
                    f"and password ({describe(exc, self._secrets)})"
                ) from exc

    def _translated(self, exc: BaseException, what: str) -> BaseException:
        """``exc`` as :meth:`translate` maps it (used on the error path of hot calls, so a
        call that succeeds does not pay for entering a context manager)."""
        try:
            with self.translate(what):
                raise exc
        except BaseException as mapped:
            return mapped
        raise AssertionError("unreachable")  # pragma: no cover

    async def _bounded(self, what: str, timeout: float | None, call: Awaitable[Any]) -> Any:
        """Await ``call`` within ``timeout`` (default ``op_timeout``), errors translated."""
        entry = self._deadlines.enter(self._timeout(timeout))
        try:
            result = await call
        except BaseException as exc:
            raise self._failed(entry, exc, what, timeout)  # noqa: B904 - see _failed
        self._deadlines.leave(entry, None)
        return result

    def _failed(
        self, entry: _Deadline, exc: BaseException, what: str, timeout: float | None
    ) -> BaseException:
        """What a bounded call that raised ``exc`` raises (its __cause__ is set)."""
        if self._deadlines.leave(entry, exc):
            return self._translated(
                TimeoutError(f"no answer within {self._timeout(timeout)} s"), what
            )
        if isinstance(exc, Exception):
            # The mapped error keeps the driver's exception as __cause__.
            return self._translated(exc, what)
        return exc  # a cancellation from outside

    def _timeout(self, timeout: float | None) -> float:
        return self.op_timeout if timeout is None else timeout

    # -- running scripts -------------------------------------------------------------------

    async def run(
        self,
        script: Script,
        keys: tuple[bytes, ...],
        args: Sequence[Any],
        *,
        timeout: float | None = None,
    ) -> Any:
        """Run ``script`` once (EVALSHA, EVAL on NOSCRIPT), bounded and translated."""
        if self.link is not None and (timeout is None or timeout == self.op_timeout):
            # The link's own timer bounds the call by op_timeout.
            return await self.finish(self.start(script, keys, args), script.name)
        # NOTE: the hot path (every acquire and release): _bounded() and _eval() inlined.
        self.round_trips += 1
        entry = self._deadlines.enter(self.op_timeout if timeout is None else timeout)
        try:
            conns = self._conns
            try:
                if self.link is not None:
                    reply = await self._eval(ScriptCall(script, keys, args))
                    result = _wire_reply(reply, raise_errors=True)
                elif conns is not None:
                    result = await conns.call(("EVALSHA", script.sha, len(keys), *keys, *args))
                else:
                    result = await self.client.execute_command(
                        "EVALSHA", script.sha, len(keys), *keys, *args
                    )
            except NoScriptError:
                # NOTE: NOSCRIPT means the script did not run, so sending it again is safe.
                # EVAL also caches it on that server for the next EVALSHA.
                self.round_trips += 1
                result = await self._call("EVAL", script.source, len(keys), *keys, *args)
        except BaseException as exc:
            raise self._failed(entry, exc, script.name, timeout)  # noqa: B904
        self._deadlines.leave(entry, None)
        return result

    def start(
        self, script: Script, keys: tuple[bytes, ...], args: Sequence[Any]
    ) -> asyncio.Future[Any]:
        """Send ``script`` on the link now; :meth:`finish` gets its answer.

        Only with a link (``self.link``); never raises: a failure is the future's result.
        """
        return self.start_call(ScriptCall(script, keys, args))

    def start_call(self, call: ScriptCall) -> asyncio.Future[Any]:
        """:meth:`start` for a call packed already."""
        self.round_trips += 1
        return self._eval(call)

    def _eval(self, call: ScriptCall) -> asyncio.Future[Any]:
        """Send ``call`` on the link; the future gets the reply (the pipe itself answers a
        NOSCRIPT by sending the script's source)."""
        assert self.link is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.link.eval(call, resolver(future))
        return future

    async def finish(self, sent: asyncio.Future[Any], what: str) -> Any:
        """The answer to :meth:`start`, as :meth:`run` gives it (errors translated; bounded
        by op_timeout through the link's timer; a NOSCRIPT was answered by the pipe)."""
        try:
            return _wire_reply(await sent, raise_errors=True)
        except Exception as exc:
            raise self._translated(exc, what)  # noqa: B904 - __cause__ is set there

    async def _pipeline(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[bytes], Sequence[Any]]],
        *,
        wait_replicas: bool,
        use_source: bool = False,
    ) -> list[Any]:
        head = ("EVAL", script.source) if use_source else ("EVALSHA", script.sha)
        commands: list[tuple[Any, ...]] = [(*head, len(k), *k, *a) for k, a in calls]
        wait_node: ClusterNode | None = None
        if wait_replicas:
            commands.append(("WAIT", self.sync_replicas, self.sync_timeout_ms))
            if isinstance(self.client, RedisCluster):
                # (only used with one call, so every key is in one slot)
                wait_node = _master_of(self.client, calls[0][0][0])
        self.round_trips += 1
        results = await self._batch(commands, wait_node=wait_node)
        if wait_node is not None and isinstance(self.client, RedisCluster):
            now = _master_of(self.client, calls[0][0][0])
            if now is None or now.name != wait_node.name:
                # The slot moved meanwhile (MOVED): that WAIT asked the wrong master.
                results[-1] = 0
        return results

    async def run_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[bytes], Sequence[Any]]],
        *,
        what: str,
        timeout: float | None = None,
        wait_replicas: bool = False,
    ) -> tuple[list[Any], int | None]:
        """Run ``script`` once per call in one pipeline (per Cluster node).

        Returns the replies and, with ``wait_replicas``, the number of replicas that
        acknowledged the writes (``WAIT``).  Calls that hit NOSCRIPT are sent again with
        EVAL (they did not run).
        """
        if not calls:
            return [], None
        wait_replicas = wait_replicas and self.sync_replicas > 0
        results = await self._bounded(
            what, timeout, self._run_many(script, calls, wait_replicas=wait_replicas)
        )
        n = len(calls)
        acks = int(results[n]) if wait_replicas else None
        return results[:n], acks

    async def _run_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[bytes], Sequence[Any]]],
        *,
        wait_replicas: bool,
    ) -> list[Any]:
        results = await self._pipeline(script, calls, wait_replicas=wait_replicas)
        n = len(calls)
        missing = [i for i in range(n) if isinstance(results[i], NoScriptError)]
        if missing:
            again = await self._pipeline(
                script, [calls[i] for i in missing], wait_replicas=wait_replicas, use_source=True
            )
            for i, reply in zip(missing, again, strict=False):
                results[i] = reply
            if wait_replicas:
                # Both pipelines' writes must have reached the replicas.
                results[n] = _min_acks(results[n], again[-1])
        for reply in results:
            if isinstance(reply, Exception):
                raise reply
        return results

    # -- the protocol ----------------------------------------------------------------------

    def acquire(
        self,
        keys: LockKeys,
        owner: str,
        lease_ms: int,
        *,
        fair: bool = False,
        queue: bool = False,
        waiter_ms: int = 0,
        timeout: float | None = None,
    ) -> Awaitable[int]:
        """One attempt (what to await): the token (``>= 1``) if granted; else ``-1 - ms``
        until a retry may be worth it (the holder's remaining lease...), or 0 when no such
        time is known."""
        if not fair and self.link is not None and timeout is None and not self.sync_replicas:
            # The hot path: the call is packed once per owner and lease length, and no
            # coroutine of its own is made.
            call = self._acquire_calls((keys, owner, lease_ms))
            return self.finish(self.start_call(call), ACQUIRE.name)
        return self._acquire(keys, owner, lease_ms, fair, queue, waiter_ms, timeout)

    async def _acquire(
        self,
        keys: LockKeys,
        owner: str,
        lease_ms: int,
        fair: bool,
        queue: bool,
        waiter_ms: int,
        timeout: float | None,
    ) -> int:
        if fair:
            script = ACQUIRE_FAIR
            k: tuple[bytes, ...] = (keys.lock, keys.counter, keys.queue, keys.deadlines)
            a: tuple[Any, ...] = (owner, lease_ms, waiter_ms, b"1" if queue else b"0")
        else:
            script = ACQUIRE
            k = (keys.lock, keys.counter)
            a = (owner, lease_ms)
        if not self.sync_replicas:
            reply: int = await self.run(script, k, a, timeout=timeout)
            return reply
        replies, acks = await self.run_many(
            script, [(k, a)], what=script.name, timeout=timeout, wait_replicas=True
        )
        value = int(replies[0])
        if value > 0 and acks is not None and acks < self.sync_replicas:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(BackendError):
                    await self.release(keys, owner, str(value), timeout=timeout)
            raise BackendError(
                f"{self.label}: only {acks} of {self.sync_replicas} replicas acknowledged the "
                f"grant of {keys.name!r} within {self.sync_timeout_ms} ms (sync_replicas); "
                f"the lock was released again"
            )
        return value

    async def renew(
        self,
        items: Sequence[tuple[LockKeys, str, str]],
        lease_ms: int,
        *,
        timeout: float | None = None,
    ) -> list[bool]:
        """Extend many leases in one pipeline: ``(keys, owner, token or '')`` each.

        Renewals do not wait for replicas (``sync_replicas`` guards grants): after a failover
        the promoted replica may have no replica of its own, and demanding acknowledgements
        then would lose every lease that the failover had kept.
        """
        calls = [((keys.lock,), (owner, token, lease_ms)) for keys, owner, token in items]
        replies, _ = await self.run_many(RENEW, calls, what="renew", timeout=timeout)
        return [reply == 1 for reply in replies]

    async def release(
        self, keys: LockKeys, owner: str, token: str = "", *, timeout: float | None = None
    ) -> bool:
        """Compare-and-delete by owner (and token unless ``''``); wakes the next waiter."""
        k, a = _release_call(keys, owner, token)
        return bool(await self.run(RELEASE, k, a, timeout=timeout) == 1)

    def start_release(self, keys: LockKeys, owner: str, token: str = "") -> Awaitable[Any]:
        """:meth:`release`, sent on the link now (only with a link); await the script's
        answer (1: released, 0: not held by ``owner``)."""
        template, anyone = self._release_calls((keys, owner))
        call = template.fill(token) if token else anyone
        return self.finish(self.start_call(call), RELEASE.name)

    async def release_transfer(
        self,
        keys: LockKeys,
        owner: str,
        token: str,
        receiver: str,
        lease_ms: int,
        *,
        timeout: float | None = None,
    ) -> int:
        """Release ``owner``'s hold and grant the lock to ``receiver`` in one round trip.

        Returns the receiver's new token (``>= 1``), 0 when ``owner`` did not hold the lock
        (nothing changed), -1 when it was released but not handed over (a fair queue
        exists; its next waiter was notified as :meth:`release` does).
        """
        if self.link is not None and timeout is None:
            # A hand-off between two tasks of this process: packed once per pair and lease
            # length, but for the token.
            call = self._transfer_calls((keys, owner, receiver, lease_ms)).fill(token)
            reply = await self.finish(self.start_call(call), RELEASE_TRANSFER.name)
        else:
            k, a = _transfer_call(keys, owner, token, receiver, lease_ms)
            reply = await self.run(RELEASE_TRANSFER, k, a, timeout=timeout)
        return int(reply)

    async def abandon(self, keys: LockKeys, owner: str, *, timeout: float | None = None) -> bool:
        """Drop the owner's hold and queue entry, if any; True if it held the lock."""
        reply = await self.run(
            ABANDON,
            (keys.lock, keys.queue, keys.deadlines),
            (owner, keys.channel, keys.waiter_prefix),
            timeout=timeout,
        )
        return bool(reply == 1)

    async def force_release(self, keys: LockKeys, *, timeout: float | None = None) -> bool:
        reply = await self.run(
            FORCE_RELEASE,
            (keys.lock, keys.queue, keys.deadlines),
            (keys.channel, keys.waiter_prefix),
            timeout=timeout,
        )
        return bool(reply == 1)

    async def status(
        self, keys: LockKeys, *, timeout: float | None = None
    ) -> tuple[str, int, int, int] | None:
        """``(owner, token, pttl ms, live fair waiters or -1)`` or None when free."""
        reply = await self.run(STATUS, (keys.lock, keys.deadlines), (), timeout=timeout)
        if not reply:
            return None
        owner = reply[0]
        if isinstance(owner, bytes):
            owner = owner.decode("utf-8", "surrogateescape")
        return str(owner), int(reply[1]), int(reply[2]), int(reply[3])

    async def ping(self, *, timeout: float | None = None) -> None:
        """Check that the server answers (and that we may talk to it)."""
        self.round_trips += 1
        await self._bounded("connect", timeout, self._ping())

    async def _ping(self) -> None:
        if self.is_cluster:
            await self.client.execute_command("PING")
            for script in ALL_SCRIPTS:
                await self.client.execute_command("SCRIPT LOAD", script.source)  # all masters
            return
        # Load the scripts now, so the first EVALSHA does not miss.
        commands = [("PING",)] + [("SCRIPT", "LOAD", s.source) for s in ALL_SCRIPTS]
        for reply in await self._batch(commands):
            if isinstance(reply, Exception):
                raise reply


def _release_call(
    keys: LockKeys, owner: str, token: str
) -> tuple[tuple[bytes, ...], tuple[str, str, bytes, bytes]]:
    """KEYS and ARGV of the RELEASE script."""
    return (keys.lock, keys.queue, keys.deadlines), (owner, token, keys.channel, keys.waiter_prefix)


def _transfer_call(
    keys: LockKeys, owner: str, token: str, receiver: str, lease_ms: int
) -> tuple[tuple[bytes, ...], tuple[str, str, str, int, bytes, bytes]]:
    """KEYS and ARGV of the RELEASE_TRANSFER script."""
    return (keys.lock, keys.counter, keys.queue, keys.deadlines), (
        owner,
        token,
        receiver,
        lease_ms,
        keys.channel,
        keys.waiter_prefix,
    )


def transfer_template(index: tuple[LockKeys, str, str, int]) -> CallTemplate:
    """The RELEASE_TRANSFER call of ``(keys, releasing owner, receiving owner, lease ms)``,
    packed but for the releaser's token (argument 1): memoize it, fill in the token per
    hand-off."""
    keys, owner, receiver, ms = index
    k, a = _transfer_call(keys, owner, "", receiver, ms)
    return CallTemplate(RELEASE_TRANSFER, k, a, 1)


def acquire_call(index: tuple[LockKeys, str, int]) -> ScriptCall:
    """The (non-fair) ACQUIRE call of ``(keys, owner, lease ms)``, packed once: an owner's
    attempts repeat it (memoize it)."""
    keys, owner, ms = index
    return ScriptCall(ACQUIRE, (keys.lock, keys.counter), (owner, ms))


def release_calls(index: tuple[LockKeys, str]) -> tuple[CallTemplate, ScriptCall]:
    """The RELEASE call of ``(keys, owner)`` packed but for the token, and with the token
    '' (any token of this owner): memoize it, fill in the token per release."""
    keys, owner = index
    k, a = _release_call(keys, owner, "")
    template = CallTemplate(RELEASE, k, a, 1)
    return template, template.fill("")


def _master_of(cluster: RedisCluster, key: bytes) -> ClusterNode | None:
    node: ClusterNode | None = cluster.get_node_from_key(key)  # type: ignore[arg-type]
    return node


def _min_acks(first: Any, second: Any) -> Any:
    if isinstance(first, Exception):
        return first
    if isinstance(second, Exception):
        return second
    return min(int(first), int(second))


# --------------------------------------------------------------------------------------------
# waiting: one pub/sub connection per backend
# --------------------------------------------------------------------------------------------


class _Channel:
    """What the hub knows about one channel."""

    __slots__ = (
        "inflight",
        "key",
        "linger",
        "missed",
        "on_server",
        "ready",
        "ready_since",
        "requested",
        "wake_when_ready",
        "wanted",
    )

    def __init__(self, key: str) -> None:
        self.key = key  # the WakeupBoard key of its waiters
        self.wanted = 0  # local waiters
        self.requested = False  # the last command sent on this connection was SUBSCRIBE
        self.inflight = 0  # (UN)SUBSCRIBE commands sent and not yet answered
        self.on_server = False  # the server has us subscribed (as of the last answer)
        self.ready = asyncio.Event()  # subscribed, and no command in flight
        self.ready_since: float | None = None  # monotonic time ``ready`` was last set
        self.wake_when_ready = False  # wake every waiter once ready (after a reconnect)
        self.missed = 0  # messages that found no local waiter to wake
        self.linger: asyncio.TimerHandle | None = None  # the pending UNSUBSCRIBE

    def set_ready(self) -> None:
        self.ready.set()
        self.ready_since = monotonic()

    def clear_ready(self) -> None:
        self.ready.clear()
        self.ready_since = None


class _HubDown(RedisConnectionError):
    """The pub/sub connection stopped answering PING."""


class _QuietWatch:
    """Notices a pub/sub connection that went silent: ``interval`` seconds after the last
    thing read it sends PING; when nothing has come ``patience`` seconds later, it cancels
    the reading ``task`` (which then sees :attr:`expired`).  One timer per connection, not
    a timeout per message read."""

    __slots__ = ("_handle", "_interval", "_patience", "_send", "_task", "clock", "expired", "last")

    def __init__(
        self,
        task: asyncio.Task[Any],
        interval: float,
        patience: float,
        send: Callable[..., None],
    ) -> None:
        loop = asyncio.get_running_loop()
        self._task = task
        self._interval = interval
        self._patience = patience
        self._send = send
        #: The loop's clock; the reader sets :attr:`last` from it per message.
        self.clock = loop.time
        #: When something was last read.
        self.last = loop.time()
        #: The PING went unanswered: the task was cancelled for it.
        self.expired = False
        self._handle = loop.call_later(interval, self._quiet)

    def _quiet(self) -> None:
        """Due ``interval`` after the last read, unless something came since."""
        loop = asyncio.get_running_loop()
        left = self.last + self._interval - loop.time()
        if left > 0:
            self._handle = loop.call_later(left, self._quiet)
            return
        sent = loop.time()
        self._send(b"PING")
        self._handle = loop.call_later(self._patience, self._answered, sent)

    def _answered(self, sent: float) -> None:
        """Due ``patience`` after a PING."""
        if self.last >= sent:
            self._quiet()
            return
        self.expired = True
        self._task.cancel()

    def stop(self) -> None:
        self._handle.cancel()


class PubSubHub:
    """One pub/sub connection shared by every waiter of one backend (all names).

    A waiter subscribes to its channel (:meth:`subscribe`) before its next attempt; the hub
    subscribes when the first local waiter of a channel arrives (and waits, bounded, until
    the server confirmed it, so a release after the attempt cannot be missed) and
    unsubscribes when the last one leaves.  A message wakes ONE local waiter of that channel
    (through the :class:`~aiodlock._waiting.WakeupBoard`).  The connection is PINGed when
    idle; when it breaks, the hub reconnects with backoff, subscribes again and then wakes
    every waiter of each restored channel (messages may have been missed meanwhile).
    Until a channel is confirmed, its waiters also poll with backoff.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[AbstractConnection]],
        board: WakeupBoard,
        *,
        op_timeout: float,
        connect_timeout: float,
        ping_interval: float,
        label: str = "redis",
        secrets: tuple[str, ...] = (),
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self._connect = connect
        self._on_reconnect = on_reconnect
        self.board = board
        self.op_timeout = op_timeout
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.label = label
        self._secrets = secrets
        self._channels: dict[bytes, _Channel] = {}
        self._conn: AbstractConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._outbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._outbox_event = asyncio.Event()
        self._closed = False
        #: Seconds a subscription outlives its last local waiter.
        self.linger = 1.0
        #: Connections made so far (the first one included): for tests.
        self.connections = 0
        #: Set while connected.
        self.connected = asyncio.Event()

    # -- public ----------------------------------------------------------------------------

    def is_ready(self, channel: bytes) -> bool:
        state = self._channels.get(channel)
        return state is not None and state.ready.is_set()

    def channels(self) -> list[bytes]:
        """Channels this process is subscribed to (or subscribing to) now."""
        return [ch for ch, st in self._channels.items() if st.wanted]

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"aiodlock:{self.label}:pubsub"
            )

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ready_since(self, channel: bytes) -> float | None:
        """Since when (monotonic) ``channel`` is confirmed without interruption, or None."""
        state = self._channels.get(channel)
        return None if state is None else state.ready_since

    async def subscribe(self, channel: bytes) -> _Channel:
        """Be subscribed to ``channel`` (shared with other local waiters) until :meth:`leave`.

        Returns once the server confirmed it, or after ``op_timeout`` (the pub/sub
        connection is down: the waiter then polls).  The subscription lingers for
        ``linger`` seconds after the last local waiter left, so a task that waits again at
        once (a loop on a contended lock, a fair waiter on its own channel) does not pay a
        SUBSCRIBE round trip each time.  If this raises (a cancellation), it left already.
        """
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = _Channel(channel.decode("latin-1"))
        state.wanted += 1
        if state.linger is not None:
            state.linger.cancel()
            state.linger = None
        try:
            self.start()
            if not state.requested and self._conn is not None:
                state.requested = True
                state.inflight += 1
                state.clear_ready()
                self._send(b"SUBSCRIBE", channel)
            if not state.ready.is_set():
                # Bounded: if the pub/sub connection is down the waiter polls instead.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.op_timeout):
                        await state.ready.wait()
        except BaseException:
            self.leave(channel, state)
            raise
        return state

    def leave(self, channel: bytes, state: _Channel) -> None:
        """One local waiter no longer needs ``channel`` (see :meth:`subscribe`)."""
        state.wanted -= 1
        if state.wanted == 0:
            if state.requested and self._conn is not None:
                loop = asyncio.get_running_loop()
                state.linger = loop.call_later(self.linger, self._unsubscribe, channel, state)
            elif state.inflight == 0 and self._channels.get(channel) is state:
                del self._channels[channel]

    def _unsubscribe(self, channel: bytes, state: _Channel) -> None:
        state.linger = None
        if state.wanted or self._channels.get(channel) is not state:
            return
        if state.requested and self._conn is not None:
            state.requested = False
            state.inflight += 1
            state.missed = 0
            state.clear_ready()
            self._send(b"UNSUBSCRIBE", channel)
        elif state.inflight == 0:
            del self._channels[channel]

    # -- the connection ---------------------------------------------------------------------

    def _send(self, *args: Any) -> None:
        self._outbox.append(args)
        self._outbox_event.set()

    async def _run(self) -> None:
        backoff = Backoff(first=0.02, cap=1.0)
        while not self._closed:
            conn: AbstractConnection | None = None
            served = False
            try:
                async with asyncio.timeout(self.connect_timeout + self.op_timeout):
                    conn = await self._connect()
                served = True
                await self._serve(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug(
                    "aiodlock: %s pub/sub connection lost: %s",
                    self.label,
                    describe(exc, self._secrets),
                )
            finally:
                self._disconnected()
                if conn is not None:
                    with (
                        anyio.CancelScope(shield=True),
                        anyio.move_on_after(1.0),
                        contextlib.suppress(Exception),
                    ):
                        await conn.disconnect(nowait=True)
            if served:
                backoff.reset()
            await asyncio.sleep(backoff.next())

    def _disconnected(self) -> None:
        self._conn = None
        self.connected.clear()
        self._outbox.clear()
        for channel, state in list(self._channels.items()):
            state.requested = False
            state.inflight = 0
            state.on_server = False
            state.missed = 0
            state.clear_ready()
            if state.linger is not None:
                state.linger.cancel()
                state.linger = None
            if not state.wanted:
                del self._channels[channel]

    async def _serve(self, conn: AbstractConnection) -> None:
        # NOTE: no await between collecting the wanted channels and publishing the
        # connection: a waiter arriving later sends its own SUBSCRIBE on this connection.
        self._outbox.clear()
        wanted = [ch for ch, st in self._channels.items() if st.wanted]
        reconnect = self.connections > 0
        for channel in wanted:
            state = self._channels[channel]
            state.requested = True
            state.inflight = 1
            # After a reconnect, messages may have been missed: wake every waiter once the
            # channel is back.  (On the first connection the waiters are still waiting for
            # the subscription, and they make their attempt right after it anyway.)
            state.wake_when_ready = reconnect
        if wanted:
            self._send(b"SUBSCRIBE", *wanted)
        self._conn = conn
        self.connections += 1
        self.connected.set()
        if reconnect and self._on_reconnect is not None:
            # The server may have restarted or failed over: so may the command connections.
            self._on_reconnect()
        writer = asyncio.get_running_loop().create_task(
            self._writer(conn), name=f"aiodlock:{self.label}:pubsub-writer"
        )
        try:
            await self._reader(conn, writer)
        finally:
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer

    async def _writer(self, conn: AbstractConnection) -> None:
        while True:
            await self._outbox_event.wait()
            self._outbox_event.clear()
            while self._outbox:
                args = self._outbox.popleft()
                await conn.send_command(*args, check_health=False)

    async def _reader(self, conn: AbstractConnection, writer: asyncio.Task[None]) -> None:
        task = asyncio.current_task()
        assert task is not None
        # NOTE: one timer for the connection's silence, not a timeout per message read
        # (redis-py's read_response(timeout=...) enters asyncio.timeout for every message).
        watch = _QuietWatch(task, self.ping_interval, self.op_timeout, self._send)
        try:
            while True:
                if writer.done():
                    writer.result()  # raises what broke the writer
                    raise _HubDown("the pub/sub writer stopped")
                try:
                    # (math.inf: no timeout of redis-py's own for this read)
                    reply = await conn.read_response(timeout=math.inf, push_request=True)
                except asyncio.CancelledError:
                    if watch.expired and task.uncancel() == 0:
                        raise _HubDown(f"no answer to PING within {self.op_timeout} s") from None
                    raise
                watch.last = watch.clock()  # anything that arrives proves the line alive
                if reply is not None:
                    self._dispatch(reply)
        finally:
            watch.stop()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = reply[0]
        if isinstance(kind, str):
            kind = kind.encode()
        channel = reply[1]
        if isinstance(channel, str):
            channel = channel.encode("latin-1")
        state = self._channels.get(channel)
        if kind == b"message":
            if state is not None and state.requested and not self.board.wake_one(state.key):
                # Nobody to wake right now: the next local waiter of this channel makes an
                # attempt at once (it may have made its last one before this release).
                state.missed += 1
        elif kind == b"subscribe":
            if state is None:
                return
            state.inflight = max(0, state.inflight - 1)
            state.on_server = True
            if state.inflight == 0 and state.requested:
                state.set_ready()
                if state.wake_when_ready:
                    state.wake_when_ready = False
                    self.board.wake_all(state.key)
        elif kind == b"unsubscribe":
            if state is None:
                return
            state.inflight = max(0, state.inflight - 1)
            state.on_server = False
            if state.inflight == 0 and not state.wanted and not state.requested:
                del self._channels[channel]


class HubWaiter(Waiter):
    """A waiter woken through a :class:`PubSubHub` (its slot on the hub's board).

    ``listening()`` tells whether a release would reach this waiter by message now (its
    channel is confirmed); while it does not, the waiter also polls with capped backoff.
    """

    __slots__ = (
        "_backoff",
        "_listening",
        "_slot",
        "attempting",
        "closing",
        "delivered",
        "granted",
        "listening_since",
        "owner",
        "transfer",
        "ttl",
        "uncertain",
        "woken",
    )

    def __init__(
        self, slot: Any, listening: Callable[[], bool], *, owner: str = "", ttl: float = 0.0
    ) -> None:
        self._slot = slot
        self._listening = listening
        self._backoff = Backoff()
        # Same-process hand-off (see RedisBackend.release): the waiting owner and its lease.
        self.owner = owner
        self.ttl = ttl
        #: A release by this process is handing the lock to this waiter right now (set when
        #: the answer is in).
        self.transfer: asyncio.Event | None = None
        #: The grant a hand-off delivered, until the waiter's next attempt takes it.
        self.delivered: Grant | None = None
        #: A hand-off to this waiter failed half-way: the server may have granted it.
        self.uncertain = False
        #: An attempt of this waiter is on its way to the server.
        self.attempting = False
        #: An attempt of this waiter returned a grant.
        self.granted = False
        #: The waiter is being left.
        self.closing = False
        #: A wake-up was consumed and the attempt it calls for has not been made yet.
        self.woken = False
        #: Since when (monotonic) a release message reaches this process on the waiter's
        #: channel, as it was when the waiter entered (see the Waiter protocol): the core
        #: then does not repeat an attempt made since.
        self.listening_since: float | None = None

    async def wait(self, timeout: float | None) -> bool:
        if not self._listening():
            delay = self._backoff.next()
            timeout = delay if timeout is None else min(delay, timeout)
        slot = self._slot
        await slot.event.wait(timeout)
        if not slot.event.is_set():
            return False
        # Consume the wake-up: the next sleep waits for a new one.
        slot.event = Wakeup()
        self._backoff.reset()
        self.woken = True
        return True

    def listening(self) -> bool:
        return self._listening()

    def wake(self) -> None:
        """Wake this waiter (whatever the others on its channel are doing)."""
        self._slot.event.set()


class _Waiting:
    """:meth:`RedisBackend.waiter`: one owner waiting for a name (a class, not a generator:
    every contended acquisition enters and leaves one).

    Entering takes a place on the board, then the name's channel (a fair waiter: its own
    channel, so a release wakes only the next in line), then registers the waiter for
    same-process hand-offs; leaving undoes it in the reverse order, first giving back what
    a hand-off left the waiter (shielded: this may run because the task was cancelled).
    """

    __slots__ = (
        "_backend",
        "_channel",
        "_hub",
        "_key",
        "_keys",
        "_local",
        "_request",
        "_slot",
        "_state",
        "_waiter",
    )

    def __init__(self, backend: RedisBackend, request: Request) -> None:
        self._backend = backend
        self._request = request

    async def __aenter__(self) -> HubWaiter:
        backend = self._backend
        request = self._request
        keys = self._keys = backend.keys_for(request.name)
        channel = keys.waiter_channel(request.owner) if request.fair else keys.channel
        self._channel = channel
        hub = self._hub = backend.hub
        self._key = (request.name, request.owner)
        slot = self._slot = backend._board.add(channel.decode("latin-1"))
        try:
            state = self._state = await hub.subscribe(channel)
        except BaseException:
            backend._board.remove(slot)
            raise
        try:
            return self._register(slot, state)
        except BaseException:  # pragma: no cover - (no await in there: a bug)
            hub.leave(channel, state)
            backend._board.remove(slot)
            raise

    def _register(self, slot: Any, state: _Channel) -> HubWaiter:
        backend = self._backend
        request = self._request
        key = self._key
        waiter = self._waiter = HubWaiter(
            slot,
            functools.partial(self._hub.is_ready, self._channel),
            owner=request.owner,
            ttl=request.ttl,
        )
        if state.missed:
            # A release came while no local waiter listened: try again at once.
            state.missed = 0
            slot.event.set()
        waiter.listening_since = state.ready_since
        backend._waiters[key] = waiter
        local: dict[str, HubWaiter] | None = None
        if not request.fair:
            local = backend._local.setdefault(request.name, {})
            local[request.owner] = waiter
        self._local = local
        return waiter

    async def __aexit__(self, *exc_info: object) -> None:
        backend = self._backend
        request = self._request
        waiter = self._waiter
        try:
            waiter.closing = True
            key = self._key
            if backend._waiters.get(key) is waiter:
                del backend._waiters[key]
            local = self._local
            if local is not None and local.get(request.owner) is waiter:
                del local[request.owner]
                if not local and backend._local.get(request.name) is local:
                    del backend._local[request.name]
            if (
                waiter.transfer is not None
                or waiter.delivered is not None
                or (waiter.uncertain and not waiter.granted)
            ):
                with anyio.CancelScope(shield=True):
                    await backend._settle(waiter, self._keys)
        finally:
            self._hub.leave(self._channel, self._state)
            backend._board.remove(self._slot)


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------

Mode = Literal["server", "unix", "sentinel", "cluster"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Settings:
    mode: Mode
    tls: bool
    hosts: tuple[tuple[str, int], ...]
    socket_path: str | None
    db: int
    service_name: str | None
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    sentinel_username: str | None
    sentinel_password: str | None = dataclasses.field(repr=False)
    client_name: str | None
    max_connections: int | None
    ssl: dict[str, Any]
    sync_replicas: int
    sync_timeout: float
    client: Any = dataclasses.field(repr=False)
    shown: str


class _GrantData:
    """What a grant needs to be renewed and released (a plain class: made per acquire)."""

    __slots__ = ("fair", "keys", "token")

    def __init__(self, keys: LockKeys, token: str, fair: bool) -> None:
        self.keys = keys
        self.token = token
        self.fair = fair

    def __repr__(self) -> str:
        return f"<_GrantData {self.keys.lock!r} token={self.token}>"


_SSL_CERT_REQS = ("required", "optional", "none")


class RedisBackend(Backend):
    """Locks on one Redis server, a Sentinel-managed master or a Redis Cluster.

    See ``docs/backends/redis.md`` for the algorithm, its guarantees and failure modes.
    """

    backend_name = "redis"
    capabilities = Capability.FAIR | Capability.FENCING | Capability.CROSS_PROCESS

    def __init__(self, settings: _Settings, config: CommonConfig) -> None:
        self.settings = settings
        self.config = config
        self._namespace = config.namespace
        self._lease_waiter_ms = _ms(config.watchdog_ttl)
        self._board = WakeupBoard()
        self._keys = key_table(config.namespace)
        self._client: AnyRedis | None = None
        self._owns_client = settings.client is None
        self._sentinel: Sentinel | None = None
        self._node: RedisNode | None = None
        self._hub: PubSubHub | None = None
        self._pubsub_rr = itertools.count()
        # Local hand-off (non-fair locks): by name, the next attempt reserved for the local
        # waiter a release by this process woke; and the waiters of this process by
        # (name, owner).
        self._handoffs = Reservations(min(0.1, config.op_timeout))
        self._waiters: dict[tuple[str, str], HubWaiter] = {}
        # Non-fair waiters of this process by name then owner, oldest first: a release
        # hands the lock straight to one of them (see release()).
        self._local: dict[str, dict[str, HubWaiter]] = {}
        #: Same-process hand-offs done in one round trip (for tests and curious users).
        self.transfers = 0
        secrets = (settings.password or "", settings.sentinel_password or "")
        self._secrets = tuple(s for s in secrets if s)

    # -- configuration ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        scheme = url.scheme
        base, _, variant = scheme.partition("+")
        tls = base == "rediss"
        mode: Mode
        if base == "unix":
            mode = "unix"
        elif variant == "sentinel":
            mode = "sentinel"
        elif variant == "cluster":
            mode = "cluster"
        else:
            mode = "server"

        client = options.pop("client", None)
        if client is not None and not isinstance(client, aioredis.Redis | RedisCluster):
            raise ConfigurationError(
                "option 'client' must be a redis.asyncio.Redis or "
                f"redis.asyncio.cluster.RedisCluster, not {type(client).__name__}"
            )
        password = take_str(options, "password", url.password, secret=True)
        username = take_str(options, "username", url.username)
        sentinel_password = take_str(options, "sentinel_password", None, secret=True)
        sentinel_username = take_str(options, "sentinel_username", None)
        client_name = take_str(options, "client_name", None)
        max_connections = take_int(options, "max_connections", 0, minimum=0) or None
        sync_replicas = take_int(options, "sync_replicas", 0, minimum=0, maximum=100)
        sync_timeout = take_float(
            options, "sync_timeout", min(1.0, config.op_timeout / 2), allow_zero=False
        )
        assert sync_timeout is not None
        if sync_replicas and sync_timeout >= config.op_timeout:
            raise ConfigurationError(
                f"option 'sync_timeout' ({sync_timeout:g} s) must be shorter than "
                f"'op_timeout' ({config.op_timeout:g} s): WAIT runs inside one round trip"
            )
        ssl = take_ssl_options(options)
        if ssl and not tls:
            raise ConfigurationError(
                f"TLS options ({', '.join(sorted(ssl))}) need a rediss:// URL, not {scheme}://"
            )

        db_option = take_int(options, "db", -1, minimum=0)
        hosts: tuple[tuple[str, int], ...] = ()
        socket_path: str | None = None
        service_name: str | None = None
        db = 0
        path = url.path
        if client is not None:
            if url.hosts or path not in ("", "/") or url.password is not None:
                raise ConfigurationError(
                    "with option 'client', the URL must not name a server "
                    f"(use '{scheme}://'), got {url.redacted()!r}"
                )
            if mode in ("sentinel", "unix"):
                raise ConfigurationError(
                    f"option 'client' takes 'redis://' or 'redis+cluster://', not {scheme}://"
                )
            if (mode == "cluster") != isinstance(client, RedisCluster):
                raise ConfigurationError(
                    "option 'client': use 'redis+cluster://' with a RedisCluster client and "
                    "'redis://' with a Redis client"
                )
        elif mode == "unix":
            if url.hosts or not path or path == "/":
                raise ConfigurationError(
                    "a unix URL is 'unix:///path/to/redis.sock' (options: ?db=N&password=...)"
                )
            socket_path = path
        elif mode == "server":
            if len(url.hosts) > 1:
                raise ConfigurationError(
                    f"a {scheme}:// URL names one server; for several use "
                    f"'{base}+cluster://h1:p1,h2:p2', '{base}+sentinel://...' or 'redlock://'"
                )
            hosts = tuple(url.host_list(DEFAULT_PORT)) or (("localhost", DEFAULT_PORT),)
            db = _db_from_path(path)
        elif mode == "sentinel":
            if not url.hosts:
                raise ConfigurationError(
                    f"a {scheme}:// URL lists the sentinels: "
                    f"'{scheme}://h1:26379,h2:26379/service_name'"
                )
            hosts = tuple(url.host_list(DEFAULT_SENTINEL_PORT))
            parts = [p for p in path.split("/") if p]
            if not parts or len(parts) > 2:
                raise ConfigurationError(
                    f"a {scheme}:// URL ends with the service name: "
                    f"'{scheme}://h1:26379,h2:26379/mymaster' (optionally '/mymaster/DB')"
                )
            service_name = parts[0]
            if len(parts) == 2:
                db = _db_from_path("/" + parts[1])
        else:  # cluster
            if not url.hosts:
                raise ConfigurationError(
                    f"a {scheme}:// URL lists one or more nodes: '{scheme}://h1:7000,h2:7001'"
                )
            hosts = tuple(url.host_list(DEFAULT_PORT))
            if path not in ("", "/", "/0"):
                raise ConfigurationError(
                    f"Redis Cluster has only database 0; remove {path!r} from the URL"
                )
        if db_option >= 0:
            if mode == "cluster" and db_option != 0:
                raise ConfigurationError("Redis Cluster has only database 0 (option 'db')")
            db = db_option

        shown = (
            url.redacted() if client is None else f"{scheme}:// (client={type(client).__name__})"
        )
        settings = _Settings(
            mode=mode,
            tls=tls,
            hosts=hosts,
            socket_path=socket_path,
            db=db,
            service_name=service_name,
            username=username,
            password=password,
            sentinel_username=sentinel_username,
            sentinel_password=sentinel_password,
            client_name=client_name,
            max_connections=max_connections,
            ssl=ssl,
            sync_replicas=sync_replicas,
            sync_timeout=sync_timeout,
            client=client,
            shown=shown,
        )
        return cls(settings, config)

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
    def client(self) -> AnyRedis:
        """The redis.asyncio client in use (after :meth:`open`)."""
        if self._client is None:
            raise BackendError("redis: the backend is not open")
        return self._client

    def _connection_kwargs(self) -> dict[str, Any]:
        s = self.settings
        return connection_kwargs(
            username=s.username,
            password=s.password,
            connect_timeout=self.config.connect_timeout,
            client_name=s.client_name,
            max_connections=s.max_connections,
            ssl=s.ssl if s.tls else None,
        )

    def _build_client(self) -> AnyRedis:
        s = self.settings
        if s.client is not None:
            client: AnyRedis = s.client
            return client
        kwargs = self._connection_kwargs()
        if s.mode == "cluster":
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in s.hosts], **kwargs
            )
        if s.mode == "sentinel":
            assert s.service_name is not None
            sentinel_kwargs: dict[str, Any] = {
                "username": s.sentinel_username,
                "password": s.sentinel_password,
                "socket_timeout": self.config.op_timeout,
                "socket_connect_timeout": self.config.connect_timeout,
                "retry": no_retry(),
            }
            if s.tls:
                sentinel_kwargs["ssl"] = True
                sentinel_kwargs.update(s.ssl)
            self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
                list(s.hosts), sentinel_kwargs=sentinel_kwargs, db=s.db, **kwargs
            )
            master: aioredis.Redis = self._sentinel.master_for(s.service_name)
            return master
        if s.mode == "unix":
            kwargs.pop("socket_connect_timeout", None)
            kwargs.pop("ssl", None)
            return aioredis.Redis(unix_socket_path=s.socket_path, db=s.db, **kwargs)
        host, port = s.hosts[0]
        return aioredis.Redis(host=host, port=port, db=s.db, **kwargs)

    def _build_link(self) -> Link | None:
        """The pipelined connection for one plain server (``redis://``, ``unix://``).

        Also for ``rediss://`` (the SSL context is redis-py's, made from the same options).
        Not for Sentinel (redis-py's pool follows the master), Cluster (redis-py routes by
        slot), a client of the caller's, or ``sync_replicas`` (a ``WAIT`` blocks its
        connection on the server, and would hold up every other request on a shared one).
        """
        s = self.settings
        if s.client is not None or s.sync_replicas or s.mode not in ("server", "unix"):
            return None
        if s.mode == "unix":
            assert s.socket_path is not None
            address = Address(path=s.socket_path)
        else:
            host, port = s.hosts[0]
            address = Address(host, port, tls=ssl_context_factory(s.ssl) if s.tls else None)
        return Link(
            "redis",
            address,
            connect_timeout=self.config.connect_timeout,
            op_timeout=self.config.op_timeout,
            username=s.username,
            password=s.password,
            db=s.db,
            client_name=s.client_name,
            scripts=ALL_SCRIPTS,
        )

    async def open(self, on_lost: LostCallback) -> None:
        self._client = self._build_client()
        self._node = RedisNode(
            self._client,
            op_timeout=self.config.op_timeout,
            label="redis",
            secrets=self._secrets,
            sync_replicas=self.settings.sync_replicas,
            sync_timeout=self.settings.sync_timeout,
            link=self._build_link(),
        )
        ttl = self.config.watchdog_ttl
        self._hub = PubSubHub(
            self._pubsub_connection,
            self._board,
            op_timeout=self.config.op_timeout,
            connect_timeout=self.config.connect_timeout,
            ping_interval=max(1.0, min(10.0, ttl / 3)),
            label="redis",
            secrets=self._secrets,
            on_reconnect=self._node.reset_connections,
        )
        await self._node.ping(timeout=self.config.connect_timeout)

    async def aclose(self) -> None:
        hub, self._hub = self._hub, None
        client, self._client = self._client, None
        sentinel, self._sentinel = self._sentinel, None
        node, self._node = self._node, None
        if hub is not None:
            await hub.aclose()
        if node is not None:
            await node.aclose()
        if client is not None and self._owns_client:
            with contextlib.suppress(Exception):
                await client.aclose()
        if sentinel is not None:
            with contextlib.suppress(Exception):
                await sentinel.aclose()

    async def _pubsub_connection(self) -> AbstractConnection:
        return await open_pubsub_connection(self.client, next(self._pubsub_rr))

    # -- the protocol ----------------------------------------------------------------------

    def keys_for(self, name: str) -> LockKeys:
        """The keys and channels of lock ``name`` in this backend's namespace."""
        return self._keys(name)

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        name = request.name
        key = (name, request.owner)
        waiter = self._waiters.get(key) if self._waiters else None
        if waiter is not None:
            if waiter.transfer is not None:
                # A release by this process is handing the lock to this waiter: its answer
                # decides (asking the server meanwhile could take the same grant twice).
                await waiter.transfer.wait()
            delivered = waiter.delivered
            if delivered is not None:
                # Handed over by a release of this process: no round trip.
                waiter.delivered = None
                waiter.woken = False
                waiter.granted = True
                return delivered
        handoff = False
        if self._handoffs and will_wait and not request.fair:
            woken = waiter is not None and waiter.woken
            barred = self._handoffs.bar(name, woken)
            if barred is not None:
                # NOTE: a release by this process just woke one of its waiters: do not
                # barge past it (the releasing task itself asking again, typically).
                return Busy(barred)
            handoff = woken and name in self._handoffs  # (this attempt is the reserved one)
        if waiter is not None:
            waiter.woken = False
        keys = self._keys(name)
        ttl = request.ttl
        started = monotonic()
        if waiter is not None:
            # NOTE: no await since the check of waiter.delivered: a release either handed
            # over before (taken above) or sees this flag and picks another waiter.
            waiter.attempting = True
        try:
            value = await self.node.acquire(
                keys,
                request.owner,
                _ms(ttl),
                fair=request.fair,
                queue=will_wait,
                waiter_ms=self._lease_waiter_ms,
            )
        finally:
            if handoff:
                self._handoffs.end(name)
            if waiter is not None:
                waiter.attempting = False
        if value > 0:
            if waiter is not None:
                waiter.granted = True
            data = _GrantData(keys, str(value), request.fair)
            return Grant(name, request.owner, value, started + ttl, data)
        return Busy((-1 - value) / 1000 if value else None)

    def waiter(self, request: Request) -> contextlib.AbstractAsyncContextManager[Waiter]:
        return _Waiting(self, request)

    async def _settle(self, waiter: HubWaiter, keys: LockKeys) -> None:
        """A waiter leaves (granted, timed out, cancelled): give back what a hand-off left it.

        Runs in the waiting owner's own task, so that owner cannot meanwhile ask again.
        """
        transfer = waiter.transfer
        if transfer is not None:
            # The releaser's round trip is bounded by op_timeout.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.op_timeout * 2):
                    await transfer.wait()
        delivered, waiter.delivered = waiter.delivered, None
        try:
            if delivered is not None:
                # Never taken (the waiter timed out or was cancelled as it came): release
                # it, which may hand it on to another waiter of this process.
                await self.release(delivered)
            elif waiter.uncertain and not waiter.granted:
                # A hand-off failed half-way and may have granted: compare-and-delete.
                await self.node.abandon(keys, waiter.owner)
        except Exception:
            log.warning(
                "aiodlock: could not give back a lock handed to a leaving waiter of %r; the "
                "server lets it expire with its lease",
                keys.name,
                exc_info=True,
            )

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        if not grants:
            return []
        started = monotonic()
        items = [(_data(g).keys, g.owner, _data(g).token) for g in grants]
        results = await self.node.renew(items, _ms(ttl))
        expires_at = started + ttl
        return [expires_at if ok else None for ok in results]

    async def release(self, grant: Grant) -> bool:
        data = _data(grant)
        waiter = self._hand_off_to(grant, data)
        if waiter is not None:
            outcome = await self._transfer(grant, data, waiter)
            if outcome is not None:
                return outcome
        pending = self.node.release(data.keys, grant.owner, data.token)
        return await self._released(grant, data, pending)

    def start_release(self, grant: Grant) -> Awaitable[bool]:
        node, data = self._node, grant.data
        if (
            node is None
            or node.link is None
            or not isinstance(data, _GrantData)
            or self._hand_off_to(grant, data) is not None
        ):
            return self.release(grant)  # (a local hand-off, or no link: nothing to win)
        return self._released(grant, data, node.start_release(data.keys, grant.owner, data.token))

    def _hand_off_to(self, grant: Grant, data: _GrantData) -> HubWaiter | None:
        """The local waiter a release of ``grant`` hands the lock to, if any."""
        if not self._local or data.fair or self.node.sync_replicas:
            return None
        return self._receiver(grant.name, grant.owner)

    async def _released(self, grant: Grant, data: _GrantData, pending: Awaitable[Any]) -> bool:
        """The plain release's answer (True or 1: released); reserves the next attempt for
        the local waiter its message wakes."""
        released = bool(await pending == 1)
        if released and not data.fair and self._expects_message(data.keys):
            self._handoffs.reserve(grant.name)
        return released

    def _expects_message(self, keys: LockKeys) -> bool:
        """Will a release message reach a local waiter of this name?

        NOTE: only when the subscription is confirmed: before that the message is lost, and
        reserving the next attempt for a waiter that is never woken would stall every local
        task for the whole hand-off window (seen as ~100 ms at the first contention).
        """
        hub = self._hub
        return (
            bool(self._board.count(keys.channel_key))
            and hub is not None
            and hub.is_ready(keys.channel)
        )

    def _receiver(self, name: str, releaser: str) -> HubWaiter | None:
        """The oldest local non-fair waiter of ``name`` that may receive a hand-off now."""
        waiters = self._local.get(name)
        if not waiters:
            return None
        for owner, waiter in waiters.items():
            if (
                owner != releaser
                and waiter.transfer is None
                and waiter.delivered is None
                and not waiter.attempting
                and not waiter.closing
            ):
                return waiter
        return None

    async def _transfer(self, grant: Grant, data: _GrantData, waiter: HubWaiter) -> bool | None:
        """Release ``grant`` handing the lock to ``waiter`` (one round trip).

        Returns what :meth:`release` returns, or None when the script failed (the caller
        then releases the usual way).
        """
        keys = data.keys
        done = asyncio.Event()
        waiter.transfer = done
        ttl = waiter.ttl
        started = monotonic()  # before sending: the delivered lease is conservative
        try:
            value = await self.node.release_transfer(
                keys, grant.owner, data.token, waiter.owner, _ms(ttl)
            )
        except BaseException as exc:
            # The script may or may not have run: the waiter asks the server itself (an
            # attempt by an owner that holds the lock gets it again), and if it leaves
            # without a grant its exit compare-and-deletes by owner.
            waiter.uncertain = True
            waiter.transfer = None
            done.set()
            waiter.wake()
            if isinstance(exc, BackendError):
                return None
            raise
        if value > 0:
            waiter.delivered = Grant(
                grant.name, waiter.owner, value, started + ttl, _GrantData(keys, str(value), False)
            )
            self.transfers += 1
        waiter.transfer = None
        done.set()
        if value > 0:
            waiter.wake()
            return True
        if value < 0:
            # Released without a hand-over (a fair queue exists): as release() does.
            if self._expects_message(keys):
                self._handoffs.reserve(grant.name)
            return True
        return False

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


def connection_kwargs(
    *,
    username: str | None = None,
    password: str | None = None,
    connect_timeout: float = 5.0,
    client_name: str | None = None,
    max_connections: int | None = None,
    ssl: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for a redis.asyncio client (or pool) the way aiodlock wants it.

    No driver retries, no socket timeout (each call is bounded by ``op_timeout`` on
    aiodlock's side: one timer instead of redis-py's timer per read and task per write),
    bytes replies.  ``ssl``: TLS options (see :func:`take_ssl_options`), ``None`` for none.
    """
    kwargs: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout,
        "retry": no_retry(),
        "health_check_interval": 0,
        "decode_responses": False,
    }
    if client_name is not None:
        kwargs["client_name"] = client_name
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    if ssl is not None:
        kwargs["ssl"] = True
        kwargs.update(ssl)
    return kwargs


async def open_pubsub_connection(client: AnyRedis, index: int = 0) -> AbstractConnection:
    """A new connection for a :class:`PubSubHub`, made like the client's own connections.

    On a Cluster it goes to the ``index``-th master (round robin over reconnects; classic
    PUBLISH reaches every node of a cluster); through Sentinel it goes to the current master.
    """
    conn: AbstractConnection
    if isinstance(client, RedisCluster):
        await client.initialize()
        nodes = client.get_primaries() or client.get_nodes()
        if not nodes:
            raise RedisClusterException("no cluster node known")
        node = nodes[index % len(nodes)]
        kwargs = dict(node.connection_kwargs)
        kwargs["retry"] = no_retry()
        conn = node.connection_class(**kwargs)
    else:
        conn = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        raise
    return conn


def _data(grant: Grant) -> _GrantData:
    data = grant.data
    if not isinstance(data, _GrantData):
        raise TypeError(f"not a redis grant: {grant!r}")
    return data


def _db_from_path(path: str) -> int:
    text = path.strip("/")
    if not text:
        return 0
    if not text.isdigit():
        raise ConfigurationError(f"the URL path must be the database number ('/0'), got {path!r}")
    return int(text)


def ssl_context_factory(options: dict[str, Any]) -> Callable[[], ssl.SSLContext]:
    """The SSL context redis-py would make from these ``ssl_*`` options (its defaults: the
    certificate required, the host name checked), made on first use."""
    context = RedisSSLContext(
        keyfile=options.get("ssl_keyfile"),
        certfile=options.get("ssl_certfile"),
        cert_reqs=options.get("ssl_cert_reqs", "required"),
        ca_certs=options.get("ssl_ca_certs"),
        ca_path=options.get("ssl_ca_path"),
        check_hostname=options.get("ssl_check_hostname", True),
    )
    return context.get


def take_ssl_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the ``ssl_*`` options (for ``rediss`` URLs) and check them."""
    ssl: dict[str, Any] = {}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path"):
        value = take_str(options, name, None)
        if value is not None:
            ssl[name] = value
    reqs = take_str(options, "ssl_cert_reqs", None)
    if reqs is not None:
        if reqs.lower() not in _SSL_CERT_REQS:
            raise ConfigurationError(
                f"option 'ssl_cert_reqs' must be one of {', '.join(_SSL_CERT_REQS)}, got {reqs!r}"
            )
        ssl["ssl_cert_reqs"] = reqs.lower()
    if "ssl_check_hostname" in options:
        ssl["ssl_check_hostname"] = take_bool(options, "ssl_check_hostname", True)
    return ssl
