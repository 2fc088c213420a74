"""An attempt's transaction (the TxnRequest of ``try_acquire``), and the translation of
its errors: a put on a lease the server no longer knows is that lease's loss."""

from __future__ import annotations

from typing import Any

import grpc

from ..._errors import BackendError
from . import _kv as kv
from ._session import Session, rpc_code
from ._txn import LeaseGone

__all__ = ["Attempts", "LeaseErrors"]


class Attempts:
    """The TxnRequests of attempts; a first attempt's is kept (a name taken again and
    again asks with the same bytes every time)."""

    #: How many first attempts' requests are kept (one per name, owner and key in use).
    kept = 1024

    def __init__(self) -> None:
        self._kept: dict[tuple[bytes, str, bool], bytes] = {}

    def request(
        self, prefix: bytes, key: bytes, owner: str, lease: int, known: int, will_wait: bool
    ) -> bytes:
        """The attempt of ``owner`` to take the lock of ``prefix`` with ``key`` (``known``:
        the key's create_revision, if an earlier attempt put it; else 0)."""
        ident = (key, owner, will_wait)
        cached = self._kept.get(ident) if not known else None
        if cached is not None:
            return cached
        put = kv.put(key, owner.encode("utf-8", "surrogatepass"), lease)
        mine = kv.get(key, keys_only=True)
        # Into an empty line, the key is put and the lock is held: one write, nothing read.
        empty = kv.cmp_create(prefix, 0, range_end=kv.prefix_end(prefix))
        if will_wait:
            # Else the key is put if it is absent, and a key just put is the newest: the two
            # newest are mine and the one ahead.  A key of mine already in the line is read,
            # with the newest key older than it, if its create_revision is known.
            behind = [mine, kv.line(prefix, newest=True, below=known - 1)] if known else [mine]
            inner = kv.txn([kv.cmp_create(key, 0)], [put, kv.newest_two(prefix)], behind)
            request = kv.txn([empty], [put], [kv.nested(inner)])
        else:  # a try-lock puts its key only into an empty line
            request = kv.txn([empty], [put], [mine, kv.line(prefix)])
        if not known:
            if len(self._kept) >= self.kept:
                self._kept.clear()
            self._kept[ident] = request
        return request


class LeaseErrors:
    """Translate an attempt's errors; a put on a lease the server no longer knows is its
    loss (detected), raised as :class:`LeaseGone`.  (A class, not a generator: it is
    entered once per attempt.)"""

    __slots__ = ("lease", "session", "what")

    def __init__(self, session: Session, lease: int, what: str) -> None:
        self.session, self.lease, self.what = session, lease, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if not isinstance(exc, Exception):
            return  # (none, or a cancellation: it goes on as it is)
        session = self.session
        try:
            with session.translate(self.what):
                raise exc
        except BackendError as error:
            if rpc_code(error) != grpc.StatusCode.NOT_FOUND:
                raise
            session.lose(self.lease, "the server no longer knows the lease (revoked or expired)")
            raise LeaseGone(str(error)) from error.__cause__
