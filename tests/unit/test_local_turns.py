"""The core's local turns (``Capability.LOCAL_TURNS``, Redlock's): one attempt per name at a
time, and whom it wakes when it fails.  On the memory backend, instrumented (its attempts can
be held on their way), not faked."""

from __future__ import annotations

import asyncio
import uuid

import aiodlock
from aiodlock._local import LocalWaiters
from aiodlock._types import Busy, Capability, Grant, Request, Waiter
from aiodlock.backends.memory import MemoryBackend

HANG = 20.0


class TurnsMemory(MemoryBackend):
    """The memory backend with local turns; an attempt of ``held_owner`` waits for ``gate``."""

    backend_name = "memory"
    capabilities = MemoryBackend.capabilities | Capability.LOCAL_TURNS

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = asyncio.Event()
        self.held_owner = ""
        self.on_its_way = asyncio.Event()

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        if request.owner == self.held_owner:
            self.on_its_way.set()
            await self.gate.wait()
        return await super().try_acquire(request, will_wait=will_wait)


class Bell(Waiter):
    """A waiter that records its wake-ups."""

    def __init__(self) -> None:
        self.rung = 0

    def wake(self) -> None:
        self.rung += 1


async def test_a_waiter_turned_away_is_woken_when_the_attempt_on_its_way_fails() -> None:
    # The waiter that the server called (the first in its line) may be a younger one than the
    # waiter whose attempt was on its way: the failed attempt must wake the one it turned
    # away, not the oldest waiter of the client.
    space = f"turns-{uuid.uuid4().hex}"
    async with aiodlock.connect(f"memory://{space}") as holder:
        plain = holder.backend
        assert isinstance(plain, MemoryBackend)
        backend = TurnsMemory(space, plain.config)  # (the holder's space: another client)
        async with holder.lock("n"):
            turns = LocalWaiters(backend)
            older = Request("n", "older", 30.0)
            called = Request("n", "called", 30.0)
            older_bell, called_bell = Bell(), Bell()
            older_entry = turns.join(older, older_bell)
            called_entry = turns.join(called, called_bell)
            backend.held_owner = "older"
            asking = asyncio.create_task(turns.first(older, True, older_entry))
            await asyncio.wait_for(backend.on_its_way.wait(), HANG)
            # (the server called "called"; another owner of the client is asking: wait)
            assert await turns.first(called, True, called_entry, woken=True) == Busy(None)
            backend.gate.set()
            assert isinstance(await asyncio.wait_for(asking, HANG), Busy)  # still held
            assert called_bell.rung == 1
            assert older_bell.rung == 0
