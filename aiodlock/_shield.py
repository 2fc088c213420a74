"""Layer 1: work that must run to its end although the task that waits for it is cancelled.

An anyio ``CancelScope(shield=True)`` holds off anyio's own cancellation only.  asyncio's
``Task.cancel()`` (what ``asyncio.timeout``, a ``TaskGroup`` and user code send) is thrown
into whatever the task awaits, shielded or not: a second cancellation that arrives while a
clean-up runs cuts the clean-up short (measured: an anyio-shielded sleep is interrupted by
the second of two ``Task.cancel()`` calls).  :func:`finish` runs the work in a task of its
own, which no cancellation of the caller reaches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["finish"]

T = TypeVar("T")


async def finish(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` in a task of its own and wait for its end, whatever cancels the caller
    meanwhile and however often; then raise the caller's cancellation if there was one (the
    work's outcome is dropped with it), else return the work's result or raise its error.

    The caller waits as long as the work runs: bound the work itself (an
    ``asyncio.timeout`` inside it), never with a scope around this call."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # (retrieved: dropped with the cancellation, never "unretrieved")
        raise asyncio.CancelledError
    return task.result()
