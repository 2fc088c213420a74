"""Deadlines for many short calls on ONE loop timer.

``asyncio.timeout`` costs a timer handle, a heap push and a cancellation per call; on a lock
cycle of two statements that is a measurable share of the client's time.  A backend whose
calls can be cut short from outside (a connection can be closed under a statement in
flight) bounds them here instead: :meth:`Deadlines.start` notes the deadline, and only the
earliest one arms the loop's timer (:class:`~aiodlock._wakeup.Timer`); a call that ends
in time costs a set insertion and a removal.  At its deadline, a call still in flight has
``expire()`` called once (the backend closes the connection, which ends the statement with
an error) and is marked :attr:`Bound.expired`, so that the backend reports a timeout, not a
lost connection.
"""

from __future__ import annotations

from collections.abc import Callable

from ._types import monotonic
from ._wakeup import Timer

__all__ = ["Bound", "Deadlines"]


class Bound:
    """One call in flight, and its deadline (on :func:`~aiodlock._types.monotonic`)."""

    __slots__ = ("deadline", "expire", "expired", "seconds")

    def __init__(self, seconds: float, expire: Callable[[], object]) -> None:
        self.seconds = seconds
        self.deadline = monotonic() + seconds
        self.expire = expire
        #: The deadline passed while the call was in flight (``expire`` was called).
        self.expired = False


class Deadlines:
    """The calls in flight of one backend, each bounded by its own deadline."""

    __slots__ = ("_bounds", "_timer")

    def __init__(self) -> None:
        self._bounds: set[Bound] = set()
        self._timer = Timer(self._due)

    def start(self, seconds: float, expire: Callable[[], object]) -> Bound:
        """A call begins: ``expire()`` if it has not :meth:`end`-ed within ``seconds``."""
        bound = Bound(seconds, expire)
        self._bounds.add(bound)
        self._timer.at(bound.deadline)  # (returns at once when an earlier one is armed)
        return bound

    def end(self, bound: Bound) -> None:
        """The call ended (in time or not)."""
        self._bounds.discard(bound)

    def cancel(self) -> None:
        """Forget every call (the backend is closing): nothing expires any more."""
        self._bounds.clear()
        self._timer.cancel()

    def _due(self, now: float) -> float | None:
        following: float | None = None
        for bound in list(self._bounds):
            if bound.deadline <= now:
                self._bounds.discard(bound)
                bound.expired = True
                bound.expire()
            elif following is None or bound.deadline < following:
                following = bound.deadline
        return following
