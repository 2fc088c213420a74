"""Helpers shared by the etcd backend tests."""

from __future__ import annotations

from etcd3aio import Etcd3Client, prefix_range_end

import aiodlock
from aiodlock.backends.etcd import EtcdBackend


def backend_of(client: aiodlock.Client) -> EtcdBackend:
    backend = client.backend
    assert isinstance(backend, EtcdBackend)
    return backend


async def keys(raw: Etcd3Client, prefix: bytes) -> list[bytes]:
    """Every key under ``prefix``, oldest first (a direct range read)."""
    assert raw.kv is not None
    reply = await raw.kv.get(prefix, range_end=prefix_range_end(prefix), keys_only=True)
    return [bytes(kv.key) for kv in sorted(reply.kvs, key=lambda kv: kv.create_revision)]
