"""The FastAPI example's behaviour on aiohttp: one resource at a time, whichever process asks.

Run it (from a checkout, with ``pip install ".[examples]"``)::

    python examples/aiohttp_app.py --port 8080                              # the embedded default
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/aiohttp_app.py --port 8080
    # or: cd examples && python -m aiohttp.web -H 127.0.0.1 -P 8080 aiohttp_app:create_app

    curl -X POST 'localhost:8080/resources/42/work?seconds=5' &
    curl -i -X POST 'localhost:8080/resources/42/work'   # 409 Conflict, Retry-After: 1

- One lock per resource id, ``resource:<id>``, taken inside the handler.
- Busy: **409 Conflict** with a ``Retry-After`` header (seconds) and a JSON ``detail``, when
  the lock is held elsewhere (``wait=0``, the default, is a try-lock: one attempt) or was not
  had within ``wait`` seconds.
- aiohttp has no dependency injection; the decorator :func:`with_resource_lease` plays the
  part of the FastAPI dependency: it holds the lock around the handler and passes the lease.
- The lease lost while the work runs: the work is cancelled and the answer is **503** with
  ``Retry-After`` (the middleware :func:`lock_errors` maps both errors).
- One client per process, opened and closed by ``cleanup_ctx``: closing it releases what it
  still holds, so a restart never leaves a resource locked for the lease's length.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

import aiodlock

#: The hint sent with every 409 and 503: seconds after which a retry makes sense.
RETRY_AFTER_SECONDS = 1

LOCKS = web.AppKey("locks", aiodlock.Client)

routes = web.RouteTableDef()


async def locks_context(app: web.Application) -> AsyncIterator[None]:
    # connect() with no URL reads AIODLOCK_URL, else uses the embedded SQLite default.
    async with aiodlock.connect() as client:
        app[LOCKS] = client
        yield


def resource_lock(request: web.Request, wait: float = 0) -> aiodlock.Lock:
    resource_id = request.match_info["resource_id"]
    return request.app[LOCKS].lock(f"resource:{resource_id}", timeout=wait)


@web.middleware
async def lock_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """LockTimeout (busy) becomes 409, LockLost 503, both with ``Retry-After``."""
    retry_after = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    try:
        return await handler(request)
    except aiodlock.LockTimeout:
        detail = "the resource is busy, try again later"
        return web.json_response({"detail": detail}, status=409, headers=retry_after)
    except aiodlock.LockLost:
        detail = "the lock was lost while working; the work was stopped"
        return web.json_response({"detail": detail}, status=503, headers=retry_after)


def seconds_query(request: web.Request, name: str, default: float) -> float:
    try:
        value = float(request.query.get(name, default))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 60:
        raise web.HTTPUnprocessableEntity(text=f"{name} must be a number of seconds, 0-60")
    return value


async def do_the_work(request: web.Request, lease: aiodlock.Lease) -> web.Response:
    """The protected work: here a sleep.  Real work passes ``lease.token`` to the storage,
    which refuses tokens older than the newest it has seen (see examples/fencing.py)."""
    started = time.time()
    await asyncio.sleep(seconds_query(request, "seconds", 0.1))
    return web.json_response(
        {
            "resource": request.match_info["resource_id"],
            "token": lease.token,
            "pid": os.getpid(),
            "started": started,
            "finished": time.time(),
        }
    )


@routes.post("/resources/{resource_id}/work")
async def work(request: web.Request) -> web.Response:
    """The lock inside the handler (``wait``: seconds to wait for it, 0 = one attempt)."""
    async with resource_lock(request, seconds_query(request, "wait", 0)) as lease:
        return await do_the_work(request, lease)


LeaseHandler = Callable[[web.Request, aiodlock.Lease], Awaitable[web.StreamResponse]]


def with_resource_lease(
    handler: LeaseHandler,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Hold ``resource:<id>`` (a try-lock) around ``handler(request, lease)``; a lost lease
    cancels the handler, and the ``async with`` raises LockLost."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        async with resource_lock(request) as lease:
            return await handler(request, lease)

    return wrapper


@routes.post("/resources/{resource_id}/report")
@with_resource_lease
async def report(request: web.Request, lease: aiodlock.Lease) -> web.Response:
    """The same lock, taken by the decorator."""
    return await do_the_work(request, lease)


@routes.get("/resources/{resource_id}/lock")
async def lock_status(request: web.Request) -> web.Response:
    """Who holds the resource's lock now (any process): ``{"held": false}`` when nobody."""
    status = await resource_lock(request).status()
    body: dict[str, Any] = {"held": False}
    if status is not None:
        body = {
            "held": True,
            "owner": status.owner,
            "token": status.token,
            "expires_in": status.expires_in,
        }
    return web.json_response(body)


def create_app(argv: list[str] | None = None) -> web.Application:
    """The application (also the entry point of ``python -m aiohttp.web``)."""
    app = web.Application(middlewares=[lock_errors])
    app.cleanup_ctx.append(locks_context)
    app.add_routes(routes)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="the aiodlock aiohttp example")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    web.run_app(create_app(), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
