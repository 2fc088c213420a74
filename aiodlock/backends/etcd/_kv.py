"""etcd's ``KV/Txn`` on a gRPC channel of our own, with a small protobuf wire codec for
the few messages a lock needs (the field numbers of etcd's ``rpc.proto`` and ``kv.proto``).

etcd3aio costs measurably per call (its protobuf objects built and parsed, an
``asyncio.timeout`` and a retry loop around every call) and a lock cycle is nothing but two
transactions; a transaction here is bytes in, bytes out on a generic ``unary_unary``
method, and the reply is parsed only as far as the lock reads it.  Nothing of etcd3aio's
private API is used: :mod:`._session` makes the channel with etcd3aio's public
``ConnectionManager``, the client's endpoints and TLS files, so both channels reach the
same members the same way, and sets the auth token on both.

Requests are built with :func:`txn` from :func:`cmp_create`, :func:`put`, :func:`delete`,
:func:`get` and :func:`line`; :class:`Txn` is the parsed answer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import grpc.aio

__all__ = [
    "ASCEND",
    "DESCEND",
    "KV",
    "KeyValue",
    "Range",
    "Txn",
    "answered",
    "cmp_create",
    "delete",
    "drop",
    "get",
    "line",
    "nested",
    "newest_two",
    "prefix_end",
    "put",
    "txn",
]

TXN = "/etcdserverpb.KV/Txn"
_CREATE = 1  # Compare.CompareTarget.CREATE (result EQUAL is 0, the default)
ASCEND, DESCEND = 1, 2  # RangeRequest.SortOrder
_BY_CREATE = 2  # RangeRequest.SortTarget.CREATE


# -- encoding --------------------------------------------------------------------------------


_SMALL = tuple(bytes((n,)) for n in range(0x80))  # the one-byte varints


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64  # (int64 on the wire: two's complement, ten bytes)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: The tags of the length-delimited fields written (numbers 1-15 and Compare.range_end, 64).
_TAG = {field: _varint(field << 3 | 2) for field in (*range(1, 16), 64)}


def _bytes(field: int, data: bytes) -> bytes:
    size = len(data)
    return _TAG[field] + (_SMALL[size] if size < 0x80 else _varint(size)) + data


def _int(field: int, n: int) -> bytes:
    return (_SMALL[field << 3] + (_SMALL[n] if 0 <= n < 0x80 else _varint(n))) if n else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range end of every key that starts with ``prefix`` (``prefix`` must not be all
    0xff bytes: the lock prefixes end with ``/``)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def cmp_create(key: bytes, revision: int, *, range_end: bytes = b"") -> bytes:
    """Compare: ``create_revision(key) == revision`` (over a range: for every key in it)."""
    body = _int(2, _CREATE) + _bytes(3, key) + _varint(5 << 3) + _varint(revision)
    return body + _bytes(64, range_end) if range_end else body


def put(key: bytes, value: bytes, lease: int) -> bytes:
    """RequestOp: put ``key`` with ``lease``."""
    return _bytes(2, _bytes(1, key) + _bytes(2, value) + _int(3, lease))


def delete(key: bytes) -> bytes:
    """RequestOp: delete ``key``."""
    return _bytes(3, _bytes(1, key))


def get(
    key: bytes,
    *,
    range_end: bytes = b"",
    limit: int = 0,
    order: int = 0,
    keys_only: bool = False,
    count_only: bool = False,
    below: int = 0,
) -> bytes:
    """RequestOp: a range read (``order``: 0, or sorted by create_revision ascending 1 /
    descending 2; ``below``: only keys created at or before that revision)."""
    body = _bytes(1, key) + (_bytes(2, range_end) if range_end else b"") + _int(3, limit)
    if order:
        body += _int(5, order) + _int(6, _BY_CREATE)
    body += _int(8, keys_only) + _int(9, count_only) + _int(13, below)
    return _bytes(1, body)


def line(prefix: bytes, *, newest: bool = False, limit: int = 1, below: int = 0) -> bytes:
    """RequestOp: the keys of a lock's line by create_revision (oldest first, or newest)."""
    order = DESCEND if newest else ASCEND
    end = prefix_end(prefix)
    return get(prefix, range_end=end, limit=limit, order=order, keys_only=True, below=below)


@functools.lru_cache(maxsize=4096)
def newest_two(prefix: bytes) -> bytes:
    """RequestOp: the two newest keys of a lock's line (kept per prefix: asked every time)."""
    return line(prefix, newest=True, limit=2)


@functools.lru_cache(maxsize=4096)
def _drop_parts(key: bytes) -> tuple[bytes, bytes]:
    return _int(2, _CREATE) + _bytes(3, key) + _varint(5 << 3), _bytes(2, delete(key))


def drop(key: bytes, revision: int) -> bytes:
    """TxnRequest: delete ``key`` if its create_revision is ``revision`` (a release: its
    parts are kept per key)."""
    head, tail = _drop_parts(key)
    return _bytes(1, head + _varint(revision)) + tail


def nested(request: bytes) -> bytes:
    """RequestOp: a transaction (built by :func:`txn`) inside a branch of another."""
    return _bytes(4, request)


def txn(compare: Sequence[bytes], success: Sequence[bytes], failure: Sequence[bytes] = ()) -> bytes:
    """TxnRequest: if every Compare holds, the ``success`` RequestOps, else ``failure``."""
    parts = [_bytes(1, c) for c in compare]
    parts += [_bytes(2, op) for op in success]
    parts += [_bytes(3, op) for op in failure]
    return b"".join(parts)


# -- decoding --------------------------------------------------------------------------------


def _read(data: bytes, i: int) -> tuple[int, int]:
    """The varint at ``data[i]`` and the index after it."""
    b = data[i]
    if b < 0x80:
        return b, i + 1
    value, shift = b & 0x7F, 7
    while True:
        i += 1
        b = data[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7


def _fields(data: bytes) -> list[tuple[int, Any]]:
    """A message's fields in order: (number, int) for varints, (number, bytes) for
    length-delimited ones (fixed-size ones are skipped: the messages read here have none)."""
    out: list[tuple[int, Any]] = []
    i, n = 0, len(data)
    while i < n:
        tag = data[i]  # (one byte: field numbers up to 15; inlined, as are short values)
        if tag < 0x80:
            i += 1
        else:
            tag, i = _read(data, i)
        kind = tag & 7
        if kind == 0:
            value = data[i]
            if value < 0x80:
                i += 1
            else:
                value, i = _read(data, i)
            out.append((tag >> 3, value))
        elif kind == 2:
            size = data[i]
            if size < 0x80:
                i += 1
            else:
                size, i = _read(data, i)
            out.append((tag >> 3, data[i : i + size]))
            i += size
        elif kind in (1, 5):
            i += 8 if kind == 1 else 4
        else:
            raise ValueError(f"etcd: a reply with protobuf wire type {kind}")
    return out


class KeyValue:
    """mvccpb.KeyValue (the fields a lock reads)."""

    __slots__ = ("create_revision", "key", "lease", "value")

    def __init__(self, data: bytes) -> None:
        self.key = self.value = b""
        self.create_revision = self.lease = 0
        for field, v in _fields(data):
            if field == 1:
                self.key = v
            elif field == 2:
                self.create_revision = v
            elif field == 5:
                self.value = v
            elif field == 6:
                self.lease = v


class Range:
    """A RangeResponse: its key-values and count."""

    __slots__ = ("count", "kvs")

    def __init__(self, data: bytes) -> None:
        self.kvs: list[KeyValue] = []
        self.count = 0
        for field, v in _fields(data):
            if field == 2:
                self.kvs.append(KeyValue(v))
            elif field == 4:
                self.count = v


class Txn:
    """A TxnResponse: the revision it was answered at, which branch ran, and per op (parsed
    when first asked for: a lock mostly needs only the branch) a :class:`Range` (a read),
    the number of keys deleted (a delete), a :class:`Txn` (a nested transaction: its
    revision is 0) or None (a put)."""

    __slots__ = ("_ops", "_responses", "revision", "succeeded")

    def __init__(self, data: bytes) -> None:
        self.revision = 0
        self.succeeded = False
        self._ops: list[bytes] = []
        self._responses: list[Range | int | Txn | None] | None = None
        for field, v in _fields(data):
            if field == 1:
                self.revision = next((x for f, x in _fields(v) if f == 3), 0)
            elif field == 2:
                self.succeeded = bool(v)
            elif field == 3:
                self._ops.append(v)

    @property
    def responses(self) -> list[Range | int | Txn | None]:
        responses = self._responses
        if responses is None:
            responses = self._responses = []
            for op in self._ops:
                for kind, body in _fields(op):
                    if kind == 1:
                        responses.append(Range(body))
                    elif kind == 3:
                        responses.append(next((x for f, x in _fields(body) if f == 2), 0))
                    elif kind == 4:
                        responses.append(Txn(body))
                    else:
                        responses.append(None)
        return responses

    def range(self, index: int) -> Range:
        answer = self.responses[index]
        assert isinstance(answer, Range)
        return answer

    def txn(self, index: int) -> Txn:
        answer = self.responses[index]
        assert isinstance(answer, Txn)
        return answer


class KV:
    """Transactions on ``channel`` (with the auth token, when there is one)."""

    __slots__ = ("_metadata", "_txn", "channel")

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._txn = channel.unary_unary(TXN, response_deserializer=Txn)
        self._metadata: tuple[tuple[str, str], ...] | None = None

    def set_token(self, token: str | None) -> None:
        self._metadata = (("token", token),) if token else None

    def txn(self, request: bytes, timeout: float) -> grpc.aio.UnaryUnaryCall[bytes, Txn]:
        """Send a TxnRequest (built by :func:`txn`); the call is under way when this returns."""
        return self._txn(request, timeout=timeout, metadata=self._metadata)


def answered(call: grpc.aio.Call) -> asyncio.Future[None]:
    """A future that is done once ``call`` is (cancelling it leaves the call running: the
    server may have applied what it sent, and the answer tells)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def finished(_: grpc.aio.Call) -> None:
        if not done.done():
            done.set_result(None)

    call.add_done_callback(finished)
    return done
