"""Redis backends: ``redis://`` (one server, Sentinel, Cluster) and ``redlock://``."""

from .backend import RedisBackend
from .redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend"]
