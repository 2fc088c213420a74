"""A FastAPI app that works on one resource at a time, whichever process or host is asked.

Run it (from a checkout, with ``pip install ".[examples]"``)::

    uvicorn --app-dir examples fastapi_app:app --port 8000                 # the embedded default
    AIODLOCK_URL=redis://127.0.0.1:6379/0 uvicorn --app-dir examples fastapi_app:app --port 8000

    curl -X POST 'localhost:8000/resources/42/work?seconds=5' &
    curl -i -X POST 'localhost:8000/resources/42/work'   # 409 Conflict, Retry-After: 1

Start it twice (two ports, or ``--workers 2``) on the same URL: the lock is shared.

- One lock per resource id, ``resource:<id>``, taken inside the handler.
- Busy: **409 Conflict** with a ``Retry-After`` header (seconds) and a JSON ``detail``, when
  the lock is held elsewhere (``wait=0``, the default, is a try-lock: one attempt) or was not
  had within ``wait`` seconds.  409 says "this request conflicts with the resource's current
  state" (here: work in progress); 423 Locked is WebDAV's and few clients know it.
- A dependency, :func:`resource_lease`, yields the lease for handlers that want the lock
  without writing the ``async with`` themselves.
- The lease lost while the work runs (the server lost the key, ``aiodlock release --force``):
  the work is cancelled and the answer is **503** with ``Retry-After``.
- One client per process, opened and closed in the app's lifespan: closing it releases what
  it still holds, so a restart never leaves a resource locked for the lease's length.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse

import aiodlock

#: The hint sent with every 409 and 503: seconds after which a retry makes sense.
RETRY_AFTER_SECONDS = 1


class State(TypedDict):
    locks: aiodlock.Client


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[State]:
    # connect() with no URL reads AIODLOCK_URL, else uses the embedded SQLite default.
    async with aiodlock.connect() as client:
        yield {"locks": client}  # request.state.locks in every request


app = FastAPI(title="aiodlock FastAPI example", lifespan=lifespan)


def locks(request: Request) -> aiodlock.Client:
    client: aiodlock.Client = request.state.locks
    return client


Locks = Annotated[aiodlock.Client, Depends(locks)]


def resource_lock(client: aiodlock.Client, resource_id: str, wait: float = 0) -> aiodlock.Lock:
    return client.lock(f"resource:{resource_id}", timeout=wait)


@app.exception_handler(aiodlock.LockTimeout)
async def busy(request: Request, exc: aiodlock.LockTimeout) -> JSONResponse:
    return JSONResponse(
        {"detail": "the resource is busy, try again later"},
        status_code=409,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


@app.exception_handler(aiodlock.LockLost)
async def lost(request: Request, exc: aiodlock.LockLost) -> JSONResponse:
    return JSONResponse(
        {"detail": "the lock was lost while working; the work was stopped"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def do_the_work(resource_id: str, lease: aiodlock.Lease, seconds: float) -> dict[str, Any]:
    """The protected work: here a sleep.  Real work passes ``lease.token`` to the storage,
    which refuses tokens older than the newest it has seen (see examples/fencing.py)."""
    started = time.time()
    await asyncio.sleep(seconds)
    return {
        "resource": resource_id,
        "token": lease.token,
        "pid": os.getpid(),
        "started": started,
        "finished": time.time(),
    }


Seconds = Annotated[float, Query(ge=0, le=60, description="how long the work takes")]


@app.post("/resources/{resource_id}/work")
async def work(
    resource_id: str,
    client: Locks,
    seconds: Seconds = 0.1,
    wait: Annotated[float, Query(ge=0, le=60, description="seconds to wait for the lock")] = 0,
) -> dict[str, Any]:
    """The lock inside the handler: LockTimeout becomes 409, LockLost 503 (handlers above)."""
    async with resource_lock(client, resource_id, wait) as lease:
        return await do_the_work(resource_id, lease, seconds)


async def resource_lease(resource_id: str, client: Locks) -> AsyncIterator[aiodlock.Lease]:
    """A dependency that holds ``resource:<id>`` around the handler (a try-lock: busy is the
    409 of :func:`busy`).  Use it with ``scope="function"``: the lock is then released before
    the response is sent, so a client that retries as soon as it has its answer finds the
    resource free.  A lost lease cancels the handler, and the ``async with`` raises LockLost."""
    async with resource_lock(client, resource_id) as lease:
        yield lease


ResourceLease = Annotated[aiodlock.Lease, Depends(resource_lease, scope="function")]


@app.post("/resources/{resource_id}/report")
async def report(resource_id: str, lease: ResourceLease, seconds: Seconds = 0.1) -> dict[str, Any]:
    """The same lock, taken by the dependency."""
    return await do_the_work(resource_id, lease, seconds)


@app.get("/resources/{resource_id}/lock")
async def lock_status(resource_id: str, client: Locks) -> dict[str, Any]:
    """Who holds the resource's lock now (any process): ``{"held": false}`` when nobody."""
    status = await resource_lock(client, resource_id).status()
    if status is None:
        return {"held": False}
    return {
        "held": True,
        "owner": status.owner,
        "token": status.token,
        "expires_in": status.expires_in,
    }
