"""The transactions' parts: etcd3aio's public request builders, with the range options its
``txn_op_get`` does not take set on the request's public protobuf fields; a grant's data."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from etcd3aio import SortOrder, SortTarget, prefix_range_end
from etcd3aio.kv import KVService

from ..._errors import BackendError

__all__ = [
    "Held",
    "LeaseGone",
    "cmp_create",
    "delete_op",
    "get_op",
    "line",
    "put_op",
    "retrieved",
]

cmp_create = KVService.txn_compare_create_revision
put_op, get_op, delete_op = KVService.txn_op_put, KVService.txn_op_get, KVService.txn_op_delete


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


def line(prefix: bytes, *, newest: bool = False, limit: int = 1, below: int = 0) -> Any:
    """A txn range op over the lock's keys, by create_revision (oldest first, or newest)."""
    op = get_op(prefix, range_end=prefix_range_end(prefix))
    r = op.request_range
    r.limit = limit
    r.sort_target = int(SortTarget.CREATE)
    r.sort_order = int(SortOrder.DESCEND if newest else SortOrder.ASCEND)
    r.keys_only = True
    if below > 0:
        r.max_create_revision = below
    return op


def retrieved(call: asyncio.Future[Any]) -> None:
    """(an attempt's answer may come when nobody waits for it any more)"""
    if not call.cancelled():
        call.exception()
