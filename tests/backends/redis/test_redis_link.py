"""The pipelined command connection of a plain Redis server (``redis._wire.Link``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

import aiodlock
from aiodlock.backends.redis._deployments import ClusterLinks, ServerLinks, connect_deployment
from aiodlock.backends.redis._scripts import RELEASE, LockKeys
from aiodlock.backends.redis._wire import Address, CallTemplate, Link, ScriptCall, pack

from .redis_helpers import HANG, ClientFactory, backend_of, connection_ids, writes

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(
    "args",
    [
        (b"SET", b"k", b"v"),
        ("SET", "ünïcödé 🔒", "\ud800"),
        (b"EVALSHA", "abc", 2, b"k1", b"k2", 0, -17, 2**63 - 1),
        (b"PING",),
        (b"SET", b"", b"\x00\r\n"),
    ],
)
def test_pack_is_the_redis_protocol(args: tuple[Any, ...]) -> None:
    reference = Connection()
    # (redis-py encodes str as UTF-8 "strict": compare lone surrogates as we send them)
    encoded = [
        a.encode("utf-8", "surrogatepass") if isinstance(a, str) and "\ud800" in a else a
        for a in args
    ]
    assert pack(*args) == b"".join(reference.pack_command(*encoded))


def test_script_calls_reuse_heads_and_stay_exact() -> None:
    keys = LockKeys("ns", "orders:42")
    k = (keys.lock, keys.queue, keys.deadlines)
    for token in ("1", "2", ""):
        a = ("owner:1", token, keys.channel, keys.waiter_prefix)
        assert ScriptCall(RELEASE, k, a).data == pack(b"EVALSHA", RELEASE.sha, 3, *k, *a)
    for i in range(5000):  # more (script, keys) pairs than the table keeps: still exact
        other = (b"x%d" % i,)
        call = ScriptCall(RELEASE, other, ("o",))
        assert call.data == pack(b"EVALSHA", RELEASE.sha, 1, *other, "o")


@pytest.mark.parametrize("slot", [0, 1, 3])
def test_a_call_template_packs_the_same_bytes_as_a_call(slot: int) -> None:
    keys = LockKeys("ns", "x{y} ü")
    k = (keys.lock, keys.queue, keys.deadlines)
    args: tuple[Any, ...] = ("owner:1", "", keys.channel, keys.waiter_prefix)
    template = CallTemplate(RELEASE, k, args, slot)
    for value in ("", "12", "ünï", 2**40):
        filled = (*args[:slot], value, *args[slot + 1 :])
        call = template.fill(value)
        assert call.data == pack(b"EVALSHA", RELEASE.sha, 3, *k, *filled)
        assert call.args == filled  # (what a NOSCRIPT resend sends)
        assert call.keys == k


def test_every_deployment_speaks_over_links() -> None:
    # (Until 2026-11-25 Sentinel, Cluster, sync_replicas and client= went through redis-py.)
    def links_of(url: str, **options: Any) -> tuple[Any, Link]:
        backend = backend_of(aiodlock.connect(url, **options))
        links, pubsub = connect_deployment(backend.settings, backend.config)
        return links, pubsub

    for url in (
        "redis://127.0.0.1:6390/0",
        "unix:///tmp/some.sock",
        "rediss://127.0.0.1:6390/0",
        "redis+sentinel://127.0.0.1:26379/mymaster",
    ):
        links, pubsub = links_of(url)
        assert isinstance(links, ServerLinks)
        assert isinstance(links.link, Link)
        assert isinstance(pubsub, Link)
    links, pubsub = links_of("redis+cluster://127.0.0.1:7000")
    assert isinstance(links, ClusterLinks)
    assert isinstance(pubsub, Link)
    links, _ = links_of("redis://127.0.0.1:6390/0", sync_replicas=1)  # WAIT: its own link
    assert isinstance(links, ServerLinks)
    mine = aioredis.Redis(host="127.0.0.1", port=6390, db=3)
    links, _ = links_of("redis://", client=mine)  # its settings, our connection
    assert isinstance(links, ServerLinks)
    assert links.link.address == Address("127.0.0.1", 6390)


async def test_many_tasks_share_one_connection(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    client = await make_client(client_name=f"{namespace}-link")
    link = backend_of(client).link
    assert link is not None
    first = await connection_ids(raw, f"{namespace}-link")  # (made by open())

    async def cycle(i: int) -> None:
        for _ in range(5):
            async with client.lock(f"n{i}"):
                await asyncio.sleep(0)

    await asyncio.gather(*(cycle(i) for i in range(64)))
    assert await connection_ids(raw, f"{namespace}-link") == first  # the same one connection
    listed = (await raw.execute_command("CLIENT", "LIST")).decode()
    named = [line for line in listed.splitlines() if f"name={namespace}-link" in line]
    assert len(named) == 1, named  # the link; no pub/sub connection was needed


async def test_the_release_is_on_the_wire_before_the_bookkeeping(
    make_client: ClientFactory,
) -> None:
    client = await make_client()
    node = backend_of(client)
    seen: list[int] = []

    class Watch(aiodlock.Observer):
        def on_released(self, lease: aiodlock.Lease, held: float) -> None:
            seen.append(len(sent))

    client.add_observer(Watch())
    lock = client.lock("early")
    await lock.acquire()
    with writes(node.link) as sent:
        await lock.release()
    assert seen == [1]  # sent, then the observers ran
    assert await lock.try_acquire() is not None  # and it was released
    await lock.release()


async def test_an_error_reply_is_a_backend_error_and_the_link_goes_on(
    make_client: ClientFactory, raw: aioredis.Redis, namespace: str
) -> None:
    client = await make_client(client_name=f"{namespace}-wrong")
    first = await connection_ids(raw, f"{namespace}-wrong")
    await raw.set(f"{namespace}:{{wrongtype}}", "a string, not a hash")
    with pytest.raises(aiodlock.BackendError) as info:
        await client.lock("wrongtype").acquire(timeout=1)
    assert "WRONGTYPE" in str(info.value)
    async with client.lock("fine") as lease:
        assert lease.token >= 1
    assert len(first) == 1
    assert await connection_ids(raw, f"{namespace}-wrong") == first  # the link goes on


@pytest.mark.slow  # (a fault: the server SIGSTOPped past op_timeout)
async def test_a_stalled_server_fails_every_pending_call_at_op_timeout(
    redis_factory: Any, make_client: ClientFactory, raw_factory: Any
) -> None:
    server = redis_factory()
    client = await make_client(server.url, op_timeout=0.5, client_name="stalled")
    async with client.lock("warm"):
        pass
    raw = raw_factory(server.url)
    first = await connection_ids(raw, "stalled")
    await asyncio.to_thread(server.pause)
    try:
        started = time.monotonic()
        calls = [client.lock(f"stalled{i}").acquire(timeout=HANG) for i in range(10)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), HANG)
        took = time.monotonic() - started
        assert all(isinstance(r, aiodlock.BackendError) for r in results), results
        assert any(isinstance(r, aiodlock.BackendTimeout) for r in results), results
        assert took < 0.5 + 2.0  # about op_timeout, not connect or lock timeouts
    finally:
        await asyncio.to_thread(server.resume)
    async with client.lock("after", timeout=HANG) as lease:  # a new connection, same client
        assert lease.token >= 1
    now = await connection_ids(raw, "stalled")
    assert len(first) == len(now) == 1
    assert now != first  # the stalled connection was given up, one new one made
