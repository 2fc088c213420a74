"""``memory://[space]``: locks inside one process, for tests and single-process apps.

The clients of a process that name the same space share its locks, also across threads.  Locks
are FIFO-fair (a release hands the lock to the oldest waiter, no barging), one fencing counter
per space gives strictly increasing tokens, and a lease that is not renewed ends on time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Self

from .._errors import ConfigurationError
from .._types import Busy, Capability, CommonConfig, Grant, LockStatus, Request, monotonic
from .._url import ParsedURL, take_bool
from ._base import Backend

__all__ = ["MemoryBackend"]

Key = tuple[str, str]


@dataclasses.dataclass(slots=True)
class _Waiter:
    request: Request
    loop: asyncio.AbstractEventLoop
    #: The doorbell: a future of the waiter's own loop (a fresh one for each sleep).
    bell: asyncio.Future[None]
    #: Set under the space's mutex when a release hands the name to this waiter.
    grant: Grant | None = None

    def ring(self) -> None:
        if not self.bell.done():
            self.bell.set_result(None)


@dataclasses.dataclass(slots=True)
class _Name:
    holder: Grant | None = None
    expires_at: float = math.inf
    queue: OrderedDict[str, _Waiter] = dataclasses.field(default_factory=OrderedDict)


class _Space:
    """One space's state, shared across threads (every access holds ``mutex``).  A lease that
    ran out ends at the next look at its name (:meth:`live`), not by a timer (one loop's)."""

    def __init__(self) -> None:
        self.names: dict[Key, _Name] = {}
        self.mutex = threading.Lock()
        #: One fencing counter for every name of the space (a released name keeps nothing).
        self.tokens = itertools.count(1).__next__

    def live(self, key: Key) -> _Name | None:
        state = self.names.get(key)
        if state is not None and state.holder is not None and monotonic() >= state.expires_at:
            self.vacate(key, state)
            return self.names.get(key)
        return state

    def held_by(self, key: Key, grant: Grant) -> _Name | None:
        state = self.live(key)
        return state if state and state.holder and state.holder.token == grant.token else None

    def grant(self, state: _Name, request: Request) -> Grant:
        state.expires_at = monotonic() + request.ttl
        state.holder = Grant(request.name, request.owner, self.tokens(), state.expires_at)
        return state.holder

    def extend(self, state: _Name, ttl: float) -> float:
        assert state.holder is not None
        state.holder.expires_at = state.expires_at = monotonic() + ttl
        return state.expires_at

    def vacate(self, key: Key, state: _Name) -> None:
        """Free the name and hand it to the oldest waiter (FIFO, no barging), in its loop."""
        state.holder = None
        while state.queue:
            waiter = state.queue.popitem(last=False)[1]
            waiter.grant = self.grant(state, waiter.request)
            with contextlib.suppress(RuntimeError):  # (a closed loop: nobody waits there)
                if waiter.loop is asyncio.get_running_loop():
                    waiter.ring()
                else:
                    waiter.loop.call_soon_threadsafe(waiter.ring)
                return
            state.holder = waiter.grant = None
        del self.names[key]

    def leave(self, key: Key, owner: str) -> None:
        state = self.names.get(key)
        if state is not None:
            state.queue.pop(owner, None)
            if state.holder is None and not state.queue:
                del self.names[key]


# NOTE: process-wide by contract (clients of one process share a named space): the library's
# one deliberate global state.  A private space (a test's, see testing.py) is not in it.
_SPACES: dict[str, _Space] = {}


class MemoryBackend(Backend):
    backend_name = "memory"
    capabilities = Capability.FAIR | Capability.ALWAYS_FAIR | Capability.FENCING

    def __init__(self, space: str, config: CommonConfig, private: bool = False) -> None:
        self.space_name = space
        self.config = config
        self._space = _Space() if private else _SPACES.setdefault(space, _Space())

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        if len(url.hosts) > 1 or url.path not in ("", "/") or url.password is not None:
            raise ConfigurationError(
                "a memory URL is 'memory://' or 'memory://SPACE' (a name, no path or password)"
            )
        space = url.hosts[0][0] if url.hosts else ""
        return cls(space, config, bool(take_bool(options, "private", False)))

    def describe(self) -> str:
        return f"memory://{self.space_name}"

    def _key(self, name: str) -> Key:
        return (self.config.namespace, name)

    async def open(self, on_lost: object) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _attempt(self, key: Key, request: Request) -> Grant | Busy:
        space = self._space
        state = space.live(key) or space.names.setdefault(key, _Name())
        holder = state.holder
        if holder is not None and holder.owner == request.owner:
            space.extend(state, request.ttl)
            return holder
        if holder is None and not state.queue:
            return space.grant(state, request)
        return Busy(None if holder is None else max(0.0, state.expires_at - monotonic()))

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        with self._space.mutex:
            return self._attempt(self._key(request.name), request)

    async def acquire(self, request: Request, deadline: float | None) -> Grant | None:
        # (why memory overrides the core's loop: docs/architecture.md, "Deviations")
        key = self._key(request.name)
        space = self._space
        loop = asyncio.get_running_loop()
        with space.mutex:
            first = self._attempt(key, request)
            if isinstance(first, Grant) or (deadline is not None and monotonic() >= deadline):
                return first if isinstance(first, Grant) else None
            waiter = space.names[key].queue[request.owner] = _Waiter(
                request, loop, loop.create_future()
            )
        try:
            while True:
                # NOTE: every decision under the mutex, the bell only wakes: a grant handed
                # over while this waiter gives up is found and returned, never left behind.
                with space.mutex:
                    state = space.live(key)
                    if waiter.grant is not None:
                        return waiter.grant
                    until = math.inf if state is None else state.expires_at
                    if deadline is not None:
                        if monotonic() >= deadline:
                            space.leave(key, request.owner)
                            return None
                        until = min(until, deadline)
                    waiter.bell = loop.create_future()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if math.isinf(until) else until - monotonic()):
                        await waiter.bell
        except BaseException:
            with space.mutex:
                space.leave(key, request.owner)
            raise

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        with self._space.mutex:
            states = [self._space.held_by(self._key(g.name), g) for g in grants]
            return [None if s is None else self._space.extend(s, ttl) for s in states]

    async def release(self, grant: Grant) -> bool:
        key = self._key(grant.name)
        with self._space.mutex:
            state = self._space.held_by(key, grant)
            if state is not None:
                self._space.vacate(key, state)
            return state is not None

    async def abandon(self, request: Request) -> None:
        key = self._key(request.name)
        with self._space.mutex:
            self._space.leave(key, request.owner)
            state = self._space.names.get(key)
            if state is not None and state.holder and state.holder.owner == request.owner:
                self._space.vacate(key, state)

    async def status(self, name: str) -> LockStatus | None:
        with self._space.mutex:
            state = self._space.live(self._key(name))
            if state is None or state.holder is None:
                return None
            left = max(0.0, state.expires_at - monotonic())
            return LockStatus(name, state.holder.owner, state.holder.token, left, len(state.queue))

    async def force_release(self, name: str) -> bool:
        key = self._key(name)
        with self._space.mutex:
            state = self._space.live(key)
            if state is None or state.holder is None:
                return False
            self._space.vacate(key, state)
            return True
