"""A grant's data, and a lost lease's error."""

from __future__ import annotations

import asyncio
import dataclasses

from ..._errors import BackendError

__all__ = ["Held", "LeaseGone"]


class LeaseGone(BackendError):
    """The server no longer knows the lease an attempt put its key with."""

    transient = True


@dataclasses.dataclass(slots=True, eq=False)
class Held:
    """A grant's ``data``: the key, its create_revision (the token), its lease, and the
    watch that reports the key's deletion by someone else (a force_release)."""

    key: bytes
    revision: int
    lease: int
    watch: asyncio.TimerHandle | asyncio.Task[None] | None = None

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
