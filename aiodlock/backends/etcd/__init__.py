"""``etcd://`` and ``etcds://``: etcd's concurrency Mutex (see docs/backends/etcd.md)."""

from .backend import EtcdBackend

__all__ = ["EtcdBackend"]
