"""``memory://[space]``: locks inside one process, for tests and single-process apps.

Every client of the process that names the same space shares its locks, so clients can be
tested against each other; different spaces are independent.  Locks are FIFO-fair: a
release hands the lock straight to the oldest waiter (no barging), a fencing counter per
name gives strictly increasing tokens, and a lease that is not renewed expires on time.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any, Self

import anyio

from .._errors import ConfigurationError
from .._types import (
    Busy,
    Capability,
    CommonConfig,
    Grant,
    LockStatus,
    LostCallback,
    Request,
    monotonic,
)
from .._url import ParsedURL, take_bool
from ._base import Backend

__all__ = ["MemoryBackend"]


@dataclasses.dataclass(slots=True)
class _Waiter:
    request: Request
    future: asyncio.Future[Grant]


@dataclasses.dataclass(slots=True)
class _Name:
    holder: Grant | None = None
    expires_at: float = math.inf
    timer: asyncio.TimerHandle | None = None
    queue: collections.OrderedDict[str, _Waiter] = dataclasses.field(
        default_factory=collections.OrderedDict
    )


class _Space:
    """The shared state of one named space."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, str], _Name] = {}
        #: The next fencing token: one counter for every name of the space (each name's
        #: tokens increase, and no name keeps a counter of its own after it is released).
        self.tokens = itertools.count(1).__next__

    def state(self, key: tuple[str, str]) -> _Name:
        state = self.names.get(key)
        if state is None:
            state = self.names[key] = _Name()
        return state

    def gc(self, key: tuple[str, str], state: _Name) -> None:
        if state.holder is None and not state.queue and self.names.get(key) is state:
            del self.names[key]

    def grant(self, key: tuple[str, str], state: _Name, request: Request) -> Grant:
        token = self.tokens()
        now = monotonic()
        grant = Grant(request.name, request.owner, token, now + request.ttl)
        state.holder = grant
        self.set_expiry(key, state, grant.expires_at or math.inf)
        return grant

    def set_expiry(self, key: tuple[str, str], state: _Name, expires_at: float) -> None:
        state.expires_at = expires_at
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if math.isfinite(expires_at):
            loop = asyncio.get_running_loop()
            delay = max(0.0, expires_at - monotonic())
            state.timer = loop.call_later(delay, self.expire, key, state)

    def expire(self, key: tuple[str, str], state: _Name) -> None:
        state.timer = None
        if state.holder is not None and monotonic() >= state.expires_at:
            self.vacate(key, state)
        elif state.holder is not None:
            self.set_expiry(key, state, state.expires_at)

    def vacate(self, key: tuple[str, str], state: _Name) -> None:
        """Free the name and hand it to the oldest live waiter (FIFO, no barging)."""
        state.holder = None
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.expires_at = math.inf
        while state.queue:
            _, waiter = state.queue.popitem(last=False)
            if waiter.future.done():
                continue
            waiter.future.set_result(self.grant(key, state, waiter.request))
            return
        self.gc(key, state)


# NOTE: process-wide by contract (clients of one process share a named space); this is the
# one deliberate piece of global state in the library.  A private space is not in it: it
# belongs to its client and goes with it.
_SPACES: dict[str, _Space] = {}


class MemoryBackend(Backend):
    backend_name = "memory"
    capabilities = Capability.FAIR | Capability.ALWAYS_FAIR | Capability.FENCING

    def __init__(self, space: str, config: CommonConfig, private: bool = False) -> None:
        self.space_name = space
        self.config = config
        #: A space of this client's own, not shared by name (a test's: see testing.py).
        self.private = private
        self._space = _Space() if private else _SPACES.setdefault(space, _Space())

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        if len(url.hosts) > 1 or url.path not in ("", "/") or url.password is not None:
            raise ConfigurationError(
                "a memory URL is 'memory://' or 'memory://SPACE' (a name, no path or password)"
            )
        space = url.hosts[0][0] if url.hosts else ""
        private = take_bool(options, "private", False)
        return cls(space, config, bool(private))

    def describe(self) -> str:
        return f"memory://{self.space_name}"

    def _key(self, name: str) -> tuple[str, str]:
        return (self.config.namespace, name)

    async def open(self, on_lost: LostCallback) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        key = self._key(request.name)
        state = self._space.state(key)
        holder = state.holder
        if holder is not None and holder.owner == request.owner:
            self._space.set_expiry(key, state, monotonic() + request.ttl)
            holder.expires_at = state.expires_at
            return holder
        if holder is None and not state.queue:
            return self._space.grant(key, state, request)
        self._space.gc(key, state)
        left = None if holder is None else max(0.0, state.expires_at - monotonic())
        return Busy(left)

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        first = await self.try_acquire(request, will_wait=True)
        if isinstance(first, Grant):
            return first
        if deadline is not None and monotonic() >= deadline:
            return None
        key = self._key(request.name)
        space = self._space
        state = space.state(key)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        state.queue[request.owner] = _Waiter(request, future)
        try:
            if deadline is None:
                return await future
            with anyio.move_on_after(deadline - monotonic()):
                return await future
            return future.result() if future.done() and not future.cancelled() else None
        finally:
            waiter = state.queue.get(request.owner)
            if waiter is not None and waiter.future is future:
                del state.queue[request.owner]
            if not future.done():
                future.cancel()
            space.gc(key, state)

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        results: list[float | None] = []
        for grant in grants:
            key = self._key(grant.name)
            state = self._space.names.get(key)
            if state is None or state.holder is None or state.holder.token != grant.token:
                results.append(None)
                continue
            expires_at = monotonic() + ttl
            self._space.set_expiry(key, state, expires_at)
            state.holder.expires_at = expires_at
            results.append(expires_at)
        return results

    async def release(self, grant: Grant) -> bool:
        key = self._key(grant.name)
        state = self._space.names.get(key)
        if state is None or state.holder is None:
            return False
        if state.holder.owner != grant.owner or state.holder.token != grant.token:
            return False
        self._space.vacate(key, state)
        return True

    async def abandon(self, request: Request) -> None:
        key = self._key(request.name)
        state = self._space.names.get(key)
        if state is None:
            return
        waiter = state.queue.pop(request.owner, None)
        if waiter is not None and not waiter.future.done():
            waiter.future.cancel()
        if state.holder is not None and state.holder.owner == request.owner:
            self._space.vacate(key, state)
        else:
            self._space.gc(key, state)

    async def status(self, name: str) -> LockStatus | None:
        state = self._space.names.get(self._key(name))
        if state is None or state.holder is None:
            return None
        holder = state.holder
        left = max(0.0, state.expires_at - monotonic())
        return LockStatus(name, holder.owner, holder.token, left, len(state.queue))

    async def force_release(self, name: str) -> bool:
        key = self._key(name)
        state = self._space.names.get(key)
        if state is None or state.holder is None:
            return False
        self._space.vacate(key, state)
        return True
