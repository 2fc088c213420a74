"""``postgresql://`` / ``postgres://``: session-level advisory locks (:mod:`.backend`, the
default) or the lock table (``strategy=table``, :mod:`.table`), both woken by LISTEN/NOTIFY
(see docs/backends/postgres.md)."""

from ._statements import lock_key
from .backend import PostgresBackend

__all__ = ["PostgresBackend", "lock_key"]
