"""``postgresql://`` / ``postgres://``: session-level advisory locks woken by LISTEN/NOTIFY
(see :mod:`.backend` and docs/backends/postgres.md)."""

from ._statements import lock_key
from .backend import PostgresBackend

__all__ = ["PostgresBackend", "lock_key"]
