"""The transactions' wire codec (aiodlock/backends/etcd/_kv.py) against a real member: what
it writes, etcd3aio reads back the same, and what etcd3aio writes, it reads the same."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import grpc.aio
import pytest
from etcd3aio import Etcd3Client

from aiodlock import BackendError, BackendTimeout
from aiodlock.backends.etcd import _kv as kv
from aiodlock.backends.etcd._session import rpc_code, translate
from tests.servers import EtcdServer, free_port

pytestmark = pytest.mark.etcd

# Bytes that need escaping nowhere, and lengths past one varint byte (128) and two (16384).
VALUE = bytes(range(256)) * 70


@pytest.fixture
async def txn(etcd_server: EtcdServer) -> AsyncIterator[kv.KV]:
    channel = grpc.aio.insecure_channel(etcd_server.address)
    yield kv.KV(channel)
    await channel.close()


async def call(
    client: kv.KV, compare: list[bytes], success: list[bytes], failure: Sequence[bytes] = ()
) -> kv.Txn:
    reply: kv.Txn = await client.txn(kv.txn(compare, success, failure), timeout=5.0)
    return reply


async def test_put_get_compare_delete_round_trip(
    txn: kv.KV, raw: Etcd3Client, namespace: str
) -> None:
    assert raw.kv is not None
    assert raw.lease is not None
    lease = (await raw.lease.grant(30)).ID  # (a large id: a long varint)
    prefix = f"/{namespace}/line/".encode()
    first, second = prefix + b"a\x00\xff", prefix + b"b" * 300

    put = await call(txn, [kv.cmp_create(first, 0)], [kv.put(first, VALUE, lease)])
    assert put.succeeded
    assert put.responses == [None]
    [stored] = (await raw.kv.get(first)).kvs
    assert (stored.value, stored.lease, stored.create_revision) == (VALUE, lease, put.revision)
    await raw.kv.put(second, b"v")  # (written by etcd3aio, read by the codec)

    again = await call(
        txn,
        [kv.cmp_create(first, 0)],
        [kv.put(first, b"no", lease)],
        [kv.get(first), kv.line(prefix, newest=True, limit=2), kv.line(prefix)],
    )
    assert not again.succeeded  # the key exists: the failure branch ran
    [mine] = again.range(0).kvs
    assert (mine.key, mine.value, mine.lease) == (first, VALUE, lease)
    assert mine.create_revision == put.revision
    assert [x.key for x in again.range(1).kvs] == [second, first]  # newest first
    assert [x.key for x in again.range(2).kvs] == [first]  # the oldest
    assert again.range(2).kvs[0].value == b""  # (keys only)

    older = await call(txn, [], [kv.line(prefix, newest=True, below=put.revision)])
    assert [x.key for x in older.range(0).kvs] == [first]
    empty = await call(txn, [], [kv.line(prefix, newest=True, below=put.revision - 1)])
    assert empty.range(0).kvs == []
    end = kv.prefix_end(prefix)
    count = await call(txn, [], [kv.get(prefix, range_end=end, count_only=True)])
    assert (count.range(0).count, count.range(0).kvs) == (2, [])
    taken = await call(txn, [kv.cmp_create(prefix, 0, range_end=end)], [kv.put(b"x", b"", 0)])
    assert not taken.succeeded  # not every key of the range has create_revision 0

    # A nested transaction in the failure branch (an attempt on a line that is not empty).
    third = prefix + b"c"
    inner = kv.txn([kv.cmp_create(third, 0)], [kv.put(third, b"3", lease), kv.newest_two(prefix)])
    behind = await call(
        txn, [kv.cmp_create(prefix, 0, range_end=end)], [kv.put(third, b"x", 0)], [kv.nested(inner)]
    )
    assert not behind.succeeded
    nested = behind.txn(0)
    assert nested.succeeded  # (its own branch)
    assert nested.revision == 0  # (only the outer reply has a header)
    assert [x.key for x in nested.range(1).kvs] == [third, second]
    [made] = (await raw.kv.get(third)).kvs
    assert (made.value, made.lease, made.create_revision) == (b"3", lease, behind.revision)
    await raw.kv.delete(third)

    stale = await txn.txn(kv.drop(first, put.revision - 1), timeout=5.0)
    assert not stale.succeeded
    assert stale.responses == []
    deleted = await txn.txn(kv.drop(first, put.revision), timeout=5.0)
    assert deleted.succeeded
    assert deleted.responses == [1]
    assert deleted.revision > put.revision
    assert (await raw.kv.get(first)).kvs == []


async def test_errors_keep_their_grpc_status(txn: kv.KV) -> None:
    with pytest.raises(BackendError) as gone, translate("acquire"):
        await call(txn, [], [kv.put(b"/k", b"v", 0x7FFF_FFFF_FFFF)])  # no such lease
    assert rpc_code(gone.value) == grpc.StatusCode.NOT_FOUND
    assert not gone.value.transient
    with pytest.raises(BackendTimeout), translate("acquire"):
        await txn.txn(kv.txn([], [kv.get(b"/k")]), timeout=-1.0)  # (a deadline past)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}") as channel:
        with pytest.raises(BackendError) as refused, translate("acquire"):
            await call(kv.KV(channel), [], [kv.get(b"/k")])
    assert rpc_code(refused.value) == grpc.StatusCode.UNAVAILABLE
    assert refused.value.transient  # (the core tries again)
