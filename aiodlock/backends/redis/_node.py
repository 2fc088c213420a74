"""RedisNode: the lock protocol on one Redis deployment (one round trip per call)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, TypeAlias

import anyio
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
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

from ..._errors import BackendError, describe, translating
from ._scripts import (
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
)
from ._wire import (
    CallTemplate,
    Link,
    ReplyError,
    ScriptCall,
    pack,
    resolver,
)

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


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.5))


class GrantData:
    """What a grant needs to be renewed and released (a plain class: made per acquire)."""

    __slots__ = ("fair", "keys", "token")

    def __init__(self, keys: LockKeys, token: str, fair: bool) -> None:
        self.keys = keys
        self.token = token
        self.fair = fair

    def __repr__(self) -> str:
        return f"<GrantData {self.keys.lock!r} token={self.token}>"


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
        self.sync_timeout_ms = ms(sync_timeout)
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
