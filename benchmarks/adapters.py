"""One small class per library: ``open``, ``new_lock``, ``acquire``, ``release``, ``close``.

Every adapter is used the way that library's README shows, with its default settings; the
comments say where an adapter had to add something (a retry loop, a thread hop).  Libraries
are imported lazily so that a missing peer only skips its adapter.

``acquire`` returns ``None`` or, for adapters whose lock is taken in another thread, the
``time.perf_counter()`` at which the lock was actually granted (the runner otherwise takes
the time when the awaited call returns).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import importlib.metadata
import time
import uuid
from typing import Any, ClassVar
from urllib.parse import urlsplit

__all__ = ["ADAPTERS", "DEFAULT_ADAPTERS", "Adapter", "versions"]

#: Lease used where a library wants one: long enough never to expire during a run.
LEASE_SECONDS = 30.0

# KEYS[1] = lock key; ARGV[1] = the owner's token; returns 1 if deleted, 0 if not ours.
COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class Adapter(abc.ABC):
    """The five calls the workloads make; one instance = one client ("one process")."""

    #: Name on the command line and in the results.
    name: ClassVar[str]
    #: What is measured, for the tables.
    library: ClassVar[str]
    #: ``subject`` (aiodlock), ``floor``, ``floor-variant``, ``peer`` or ``smoke``.
    role: ClassVar[str]
    #: Distribution names whose versions go into the results.
    packages: ClassVar[tuple[str, ...]] = ()
    needs_redis: ClassVar[bool] = True
    #: Can wait for a held lock (takes part in the contention workloads).
    can_wait: ClassVar[bool] = True
    supports_fair: ClassVar[bool] = False

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._admin: Any = None

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        """Why this adapter cannot run here (a missing package), or None."""
        return None

    def master_hosts(self) -> list[tuple[str, int]]:
        """The Redis masters a (Red)lock peer spreads over: the URL's one by default."""
        return [_host_port(self.url)]

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    def new_lock(self, name: str, fair: bool = False) -> Any:
        """A lock handle for one worker (each worker gets its own handle)."""

    @abc.abstractmethod
    async def acquire(self, lock: Any) -> float | None:
        """Wait until held (no timeout)."""

    @abc.abstractmethod
    async def release(self, lock: Any) -> None: ...

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.aclose()
            self._admin = None

    async def abort(self, name: str) -> None:
        """Free ``name`` whoever holds it (only used when a run does not drain in time)."""
        if self.url is None:
            return
        import redis.asyncio as aioredis

        if self._admin is None:
            self._admin = aioredis.Redis.from_url(self.url)
        async for key in self._admin.scan_iter(match=f"*{name}*"):
            await self._admin.delete(key)


def _host_port(url: str | None) -> tuple[str, int]:
    parts = urlsplit(url or "")
    return parts.hostname or "127.0.0.1", parts.port or 6379


def _missing(*modules: str) -> str | None:
    for module in modules:
        try:
            __import__(module)
        except ImportError as exc:
            return f"{module} is not installed ({exc}); pip install 'aiodlock[bench]'"
    return None


# --------------------------------------------------------------------------------------------
# aiodlock (through the public API only)
# --------------------------------------------------------------------------------------------


class AiodlockAdapter(Adapter):
    """aiodlock through its public API; subclasses say how to connect (one per backend)."""

    role = "subject"
    #: Keyword options for ``aiodlock.connect``.
    connect_options: ClassVar[dict[str, Any]] = {}

    def _url(self) -> str:
        assert self.url is not None
        return self.url

    def _client(self) -> Any:
        import aiodlock

        return aiodlock.connect(self._url(), **self.connect_options)

    async def open(self) -> None:
        self.client = self._client()
        await self.client.open()

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return self.client.lock(name, fair=fair)

    async def acquire(self, lock: Any) -> float | None:
        await lock.acquire()
        return None

    async def release(self, lock: Any) -> None:
        await lock.release()

    async def close(self) -> None:
        await self.client.close()
        await super().close()

    async def abort(self, name: str) -> None:
        await self.client.force_release(name)


class AiodlockRedis(AiodlockAdapter):
    name = "aiodlock"
    library = "aiodlock (redis://)"
    role = "subject"
    packages = ("aiodlock", "redis", "hiredis")
    supports_fair = True

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        import aiodlock

        try:
            aiodlock.connect(url or "redis://127.0.0.1:1/0")
        except aiodlock.ConfigurationError as exc:
            return f"aiodlock.connect() refused the URL: {exc}"
        return None


class AiodlockMemory(AiodlockRedis):
    """``memory://``: no server; a smoke adapter for the runner itself."""

    name = "memory"
    library = "aiodlock (memory://)"
    role = "smoke"
    packages = ("aiodlock",)
    needs_redis = False

    def _url(self) -> str:
        # A private space per adapter instance: separate instances do not share locks,
        # like separate processes would not.
        return f"memory://bench-{uuid.uuid4().hex[:12]}"

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return None


# --------------------------------------------------------------------------------------------
# the floor: the least a Redis lock can do
# --------------------------------------------------------------------------------------------


class _FloorLock:
    __slots__ = ("key", "token")

    def __init__(self, key: str) -> None:
        self.key = key
        self.token = uuid.uuid4().hex


class _RawConnections:
    """redis.asyncio ``Connection`` objects used directly, last in first out.

    A command is packed, sent and its reply read on an idle connection (a new one when
    none is idle): none of the client's per-command machinery (pool checkout, response
    callbacks, retries).  One task only ever uses one connection.
    """

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        # The pool only builds connections with the URL's settings (and the hiredis parser).
        self.pool = aioredis.ConnectionPool.from_url(url)
        self.idle: list[Any] = []

    async def call(self, *args: Any) -> Any:
        conn = self.idle.pop() if self.idle else self.pool.make_connection()
        try:
            await conn.send_packed_command(conn.pack_command(*args), check_health=False)
            return await conn.read_response()
        finally:
            self.idle.append(conn)

    async def aclose(self) -> None:
        idle, self.idle = self.idle, []
        for conn in idle:
            await conn.disconnect()
        await self.pool.disconnect()


class Floor(Adapter):
    """The least a Redis lock can cost through redis.asyncio (hiredis parser).

    ``SET key token NX PX`` to acquire, ``EVALSHA`` of a compare-and-delete script to
    release, sent on a bare ``Connection`` (one per concurrently running task; one task
    uses one connection).  No waiting, no watchdog, no fencing, no timeouts.
    """

    name = "floor"
    library = "raw floor: SET NX PX + EVALSHA compare-and-delete on a bare connection"
    role = "floor"
    packages = ("redis", "hiredis")
    can_wait = False

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return _missing("redis")

    async def open(self) -> None:
        self.conns = _RawConnections(self.url or "")
        self.sha = await self.conns.call("SCRIPT", "LOAD", COMPARE_AND_DELETE)
        self.px = int(LEASE_SECONDS * 1000)

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return _FloorLock(name)

    async def acquire(self, lock: Any) -> float | None:
        if await self.conns.call("SET", lock.key, lock.token, "NX", "PX", self.px) is None:
            raise RuntimeError(f"the floor does not wait, and {lock.key!r} is held")
        return None

    async def release(self, lock: Any) -> None:
        await self.conns.call("EVALSHA", self.sha, 1, lock.key, lock.token)

    async def close(self) -> None:
        await self.conns.aclose()
        await super().close()


class FloorApi(Adapter):
    """The same two commands through the ordinary client API (``redis.set``, ``evalsha``).

    Shows what redis-py's per-command machinery costs; not the floor of the targets.
    """

    name = "floor-api"
    library = "SET NX PX + EVALSHA through redis.asyncio.Redis methods"
    role = "floor-variant"
    packages = ("redis", "hiredis")
    can_wait = False

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return _missing("redis")

    async def open(self) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.Redis.from_url(self.url or "")
        self.sha = await self.redis.script_load(COMPARE_AND_DELETE)

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return _FloorLock(name)

    async def acquire(self, lock: Any) -> float | None:
        if not await self.redis.set(lock.key, lock.token, nx=True, px=int(LEASE_SECONDS * 1000)):
            raise RuntimeError(f"the floor does not wait, and {lock.key!r} is held")
        return None

    async def release(self, lock: Any) -> None:
        await self.redis.evalsha(self.sha, 1, lock.key, lock.token)

    async def close(self) -> None:
        await self.redis.aclose()
        await super().close()


# --------------------------------------------------------------------------------------------
# peers, with their default settings
# --------------------------------------------------------------------------------------------


class RedisPyLock(Adapter):
    """``redis.asyncio.Redis.lock(name)``: no expiry, polls every 0.1 s while waiting."""

    name = "redis-py"
    library = "redis-py asyncio Lock (defaults)"
    role = "peer"
    packages = ("redis", "hiredis")

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return _missing("redis")

    async def open(self) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.Redis.from_url(self.url or "")

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return self.redis.lock(name)

    async def acquire(self, lock: Any) -> float | None:
        if not await lock.acquire():
            raise RuntimeError("redis-py Lock.acquire() returned False without a timeout")
        return None

    async def release(self, lock: Any) -> None:
        await lock.release()

    async def close(self) -> None:
        await self.redis.aclose()
        await super().close()


class PotteryRedlock(Adapter):
    """pottery ``AIORedlock`` on one master: 10 s auto-release, retries after 0-0.2 s."""

    name = "pottery"
    library = "pottery AIORedlock (1 master, defaults)"
    role = "peer"
    packages = ("pottery", "redis")

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return _missing("pottery", "redis")

    async def open(self) -> None:
        import redis.asyncio as aioredis

        self.masters = {aioredis.Redis(host=h, port=p) for h, p in self.master_hosts()}

    def new_lock(self, name: str, fair: bool = False) -> Any:
        from pottery import AIORedlock

        return AIORedlock(key=name, masters=self.masters)

    async def acquire(self, lock: Any) -> float | None:
        if not await lock.acquire():
            raise RuntimeError("AIORedlock.acquire() returned False without a timeout")
        return None

    async def release(self, lock: Any) -> None:
        await lock.release()

    async def close(self) -> None:
        for master in self.masters:
            await master.aclose()
        await super().close()


class _AioredlockHandle:
    __slots__ = ("held", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.held: Any = None


class Aioredlock(Adapter):
    """aioredlock ``Aioredlock``: 3 tries 0.1-0.3 s apart, then ``LockError``.

    It has no "wait forever", so the adapter calls ``lock()`` again after each
    ``LockError`` (what an application has to write).  It runs on aioredis 1.3.
    """

    name = "aioredlock"
    library = "aioredlock (defaults, retried on LockError)"
    role = "peer"
    packages = ("aioredlock", "aioredis")

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return _missing("aioredlock")

    async def open(self) -> None:
        from aioredlock import Aioredlock as Manager

        self.manager = Manager([{"host": h, "port": p} for h, p in self.master_hosts()])

    def new_lock(self, name: str, fair: bool = False) -> Any:
        return _AioredlockHandle(name)

    async def acquire(self, lock: Any) -> float | None:
        from aioredlock import LockError

        while True:
            try:
                lock.held = await self.manager.lock(lock.name)
            except LockError:
                continue
            return None

    async def release(self, lock: Any) -> None:
        held, lock.held = lock.held, None
        await self.manager.unlock(held)

    async def close(self) -> None:
        await self.manager.destroy()
        await super().close()


class PythonRedisLock(Adapter):
    """python-redis-lock (sync; waits on BLPOP of a signal list), defaults: no expiry.

    Its blocking calls run in this adapter's own thread pool (large enough that every
    worker's blocking acquire has a thread; asyncio's default pool has only cpu+4 threads
    and would deadlock); ``acquire`` reports the time the lock was granted in the thread.
    """

    name = "python-redis-lock"
    library = "python-redis-lock (sync, in threads)"
    role = "peer"
    packages = ("python-redis-lock", "redis", "hiredis")
    max_threads = 160

    @classmethod
    def unavailable(cls, url: str | None) -> str | None:
        return _missing("redis_lock", "redis")

    async def open(self) -> None:
        import redis

        self.redis = redis.Redis.from_url(self.url or "")
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.max_threads, thread_name_prefix="python-redis-lock"
        )
        self.loop = asyncio.get_running_loop()

    def new_lock(self, name: str, fair: bool = False) -> Any:
        import redis_lock

        return redis_lock.Lock(self.redis, name)

    @staticmethod
    def _acquire_timed(lock: Any) -> float:
        if not lock.acquire():
            raise RuntimeError("redis_lock.Lock.acquire() returned False without a timeout")
        return time.perf_counter()

    async def acquire(self, lock: Any) -> float | None:
        return await self.loop.run_in_executor(self.pool, self._acquire_timed, lock)

    async def release(self, lock: Any) -> None:
        await self.loop.run_in_executor(self.pool, lock.release)

    async def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.redis.close()
        await super().close()

    async def abort(self, name: str) -> None:
        import redis_lock

        # reset() deletes the key and pushes the signal, which wakes one BLPOP waiter.
        await self.loop.run_in_executor(self.pool, redis_lock.Lock(self.redis, name).reset)


ADAPTERS: dict[str, type[Adapter]] = {
    cls.name: cls
    for cls in (
        AiodlockRedis,
        Floor,
        FloorApi,
        RedisPyLock,
        PotteryRedlock,
        Aioredlock,
        PythonRedisLock,
        AiodlockMemory,
    )
}

#: Everything but the memory smoke adapter.
DEFAULT_ADAPTERS = [
    "aiodlock",
    "floor",
    "floor-api",
    "redis-py",
    "pottery",
    "aioredlock",
    "python-redis-lock",
]


def versions(names: list[str]) -> dict[str, str]:
    """Installed versions of the packages the given adapters use."""
    found: dict[str, str] = {}
    for name in names:
        for package in ADAPTERS[name].packages:
            try:
                found[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                found[package] = "not installed"
    return found
