"""Hooks for metrics and logging layers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._lease import Lease

__all__ = ["Observer"]

log = logging.getLogger("aiodlock")


class Observer:
    """Lock events of a client (:meth:`aiodlock.Client.add_observer`); override what you need.
    Hooks run synchronously on the event loop, keep them cheap; an exception in one is logged
    and never reaches the lock's caller."""

    def on_acquired(self, lease: Lease, waited: float) -> None:
        """A lock was acquired (not called for reentrant acquires) after ``waited`` seconds."""

    def on_timeout(self, name: str, owner: str, waited: float) -> None:
        """An acquire gave up at its deadline."""

    def on_released(self, lease: Lease, held: float) -> None:
        """The last release of a holding, ``held`` seconds after it was acquired."""

    def on_lost(self, lease: Lease, reason: str) -> None:
        """A lease was lost while held."""


def notify(observers: list[Observer], method: str, *args: object) -> None:
    for observer in observers:
        try:
            getattr(observer, method)(*args)
        except Exception:
            log.exception("aiodlock observer %r failed in %s", observer, method)
