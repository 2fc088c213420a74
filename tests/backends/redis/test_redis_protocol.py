"""The Redis protocol: key layout, scripts, idempotency, round trips, names, status, errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

import aiodlock
from aiodlock._types import Busy, Grant, Request
from aiodlock.backends.redis._deployments import ServerLinks, connect_deployment
from aiodlock.backends.redis._scripts import ALL_SCRIPTS, LockKeys, escape_name
from tests.helpers import make_tls_certs, tls_server_args
from tests.servers import RedisServer, free_port

from .redis_helpers import (
    HANG,
    ClientFactory,
    RawFactory,
    backend_of,
    connection_ids,
    eventually,
    keys_of,
    script_calls,
    writes,
)

pytestmark = pytest.mark.redis

NASTY_NAMES = [
    "{",
    "}",
    "{}",
    "a{b}c",
    "}{",
    "%7B",
    "%257B",
    "with space",
    "new\nline",
    "nul\x00byte",
    "tab\tand\r\n",
    "ünïcödé 🔒 名前",
    "\ud800 lone surrogate",
    "x" * 512,
    "{" * 512,
]


def test_escape_name_gives_one_tag_and_is_injective() -> None:
    escaped = [escape_name(name) for name in NASTY_NAMES]
    assert len(set(escaped)) == len(NASTY_NAMES)
    for value in escaped:
        assert b"{" not in value
        assert b"}" not in value
    assert escape_name("orders:42") == b"orders:42"  # readable when nothing needs escaping
    assert escape_name("Key") != escape_name("key")


@pytest.mark.parametrize("name", ["orders:42", "a{b}c", "x" * 512, "ünï{cöde}"])
def test_all_keys_of_a_name_share_one_cluster_slot(name: str) -> None:
    keys = LockKeys("ns", name)
    slots = {key_slot(k) for k in (keys.lock, keys.counter, keys.queue, keys.deadlines)}
    assert len(slots) == 1
    assert keys.lock.startswith(b"ns:{")


def test_every_script_is_headed_with_keys_argv_and_returns() -> None:
    for script in ALL_SCRIPTS:
        head = script.source.lstrip().split("\n")[:12]
        text = "\n".join(head)
        assert text.startswith("--"), script.name
        assert "KEYS[1]" in text, script.name
        assert "returns" in text, script.name
        assert len(script.sha) == 40


async def test_data_layout_follows_rlock(
    client: aiodlock.Client, raw: aioredis.Redis, namespace: str
) -> None:
    async with client.lock("orders:42") as lease:
        key = f"{namespace}:{{orders:42}}".encode()
        assert await raw.hgetall(key) == {lease.owner.encode(): str(lease.token).encode()}
        pttl = await raw.pttl(key)
        assert 0 < pttl <= client.config.watchdog_ttl * 1000
        assert int(await raw.get(key + b":token")) == lease.token
    assert await raw.exists(key) == 0
    # the fencing counter stays, so tokens keep increasing
    assert int(await raw.get(key + b":token")) == lease.token


async def test_one_round_trip_per_acquire_and_per_release(
    client: aiodlock.Client, raw: aioredis.Redis
) -> None:
    lock = client.lock("rt")
    await lock.acquire()
    await lock.release()  # warm up (connections, scripts)
    before = await script_calls(raw)
    await lock.acquire()
    assert await script_calls(raw) == before + 1
    await lock.acquire()  # reentrant: no round trip
    await lock.release()
    assert await script_calls(raw) == before + 1
    await lock.release()
    assert await script_calls(raw) == before + 2


async def test_scripts_are_run_by_sha_and_noscript_is_handled(
    client: aiodlock.Client, raw: aioredis.Redis
) -> None:
    lock = client.lock("noscript")
    await raw.script_flush()
    lease = await lock.acquire()  # NOSCRIPT -> EVAL, transparently
    assert lease.token >= 1
    info = await raw.info("commandstats")
    assert info["cmdstat_eval"]["calls"] >= 1
    evalsha_before = (await raw.info("commandstats"))["cmdstat_evalsha"]["calls"]
    await lock.release()
    assert (await raw.info("commandstats"))["cmdstat_evalsha"]["calls"] == evalsha_before + 1


async def test_an_attempt_by_the_holder_is_idempotent(
    client: aiodlock.Client, raw: aioredis.Redis
) -> None:
    backend = backend_of(client)
    request = Request("idem", "someone:1", 5.0)
    first = await backend.try_acquire(request, will_wait=False)
    assert isinstance(first, Grant)
    await raw.pexpire(backend.keys_for("idem").lock, 1000)
    again = await backend.try_acquire(Request("idem", "someone:1", 7.0), will_wait=False)
    assert isinstance(again, Grant)
    assert again.token == first.token  # same token: a retried attempt did not count twice
    assert await raw.pttl(backend.keys_for("idem").lock) > 5000  # lease refreshed
    assert int(await raw.get(backend.keys_for("idem").counter)) == first.token
    assert await backend.release(again)


async def test_busy_reports_the_holders_remaining_lease(make_client: ClientFactory) -> None:
    a = await make_client()
    b = await make_client()
    async with a.lock("busy", ttl=3.0):
        result = await backend_of(b).try_acquire(Request("busy", "other:1", 5.0), will_wait=False)
        assert isinstance(result, Busy)
        assert result.retry_after is not None
        assert 0 < result.retry_after <= 3.0


async def test_tokens_strictly_increase_across_clients(make_client: ClientFactory) -> None:
    clients = [await make_client() for _ in range(3)]
    tokens = []
    for round_ in range(4):
        for c in clients:
            async with c.lock("fence") as lease:
                tokens.append(lease.token)
        del round_
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


async def test_status_from_another_client(make_client: ClientFactory) -> None:
    a = await make_client()
    b = await make_client()
    assert await b.status("st") is None
    async with a.lock("st") as lease:
        status = await b.status("st")
        assert status is not None
        assert (status.owner, status.token) == (lease.owner, lease.token)
        assert status.expires_in is not None
        assert 0 < status.expires_in <= a.config.watchdog_ttl
        assert status.waiters is None  # not a fair lock: the server does not count waiters
    assert await b.status("st") is None


@pytest.mark.parametrize("name", NASTY_NAMES, ids=lambda n: repr(n)[:20])
async def test_any_name_works(make_client: ClientFactory, name: str) -> None:
    a = await make_client()
    b = await make_client()
    lock = a.lock(name)
    async with lock as lease:
        assert await b.lock(name).try_acquire() is None
        status = await b.status(name)
        assert status is not None
        assert status.token == lease.token
    other = await b.lock(name).try_acquire()
    assert other is not None
    await b.lock(name).release()


async def test_similar_names_are_different_locks(
    client: aiodlock.Client, make_client: ClientFactory
) -> None:
    other = await make_client()
    names = ["{", "%7B", "%257B", "Key", "key", "a b", "a  b"]
    for name in names:
        await client.lock(name).acquire()
    for name in names:
        status = await other.status(name)
        assert status is not None, name
        assert status.token == 1, name
    for name in names:
        await client.lock(name).release()


async def test_release_after_the_lease_expired_is_reported(
    client: aiodlock.Client, make_client: ClientFactory, raw: aioredis.Redis
) -> None:
    other = await make_client()
    lock = client.lock("expired", ttl=0.2, on_lost="ignore")
    lease = await lock.acquire()
    second = await other.lock("expired").acquire(timeout=HANG)
    assert second.token > lease.token
    await lock.release()  # on_lost="ignore": no exception, but the lease is lost
    assert lease.lost
    status = await other.status("expired")
    assert status is not None
    assert status.owner == second.owner
    await other.lock("expired").release()


async def test_force_release(make_client: ClientFactory) -> None:
    a = await make_client(watchdog_ttl=0.6)
    b = await make_client()
    lost = asyncio.Event()
    lock = a.lock("forced", on_lost=lambda lease: lost.set())
    await lock.acquire()
    assert await b.force_release("forced")
    assert not await b.force_release("forced")
    async with asyncio.timeout(HANG):
        await lost.wait()  # the holder notices at its next renewal
    lease = await b.lock("forced").acquire(timeout=1)
    assert lease is not None


async def test_renew_is_one_pipeline_for_many_grants(client: aiodlock.Client) -> None:
    backend = backend_of(client)
    grants = []
    for i in range(300):
        grant = await backend.try_acquire(Request(f"many:{i}", "bulk:1", 5.0), will_wait=False)
        assert isinstance(grant, Grant)
        grants.append(grant)
    stolen = grants[7]
    assert await backend.force_release(stolen.name)
    with writes(backend.link) as sent:
        started = time.monotonic()
        results = await backend.renew(grants, 9.0)
    assert len(sent) == 1
    assert results[7] is None
    assert all(r is not None and r >= started + 9.0 for i, r in enumerate(results) if i != 7)
    for grant in grants:
        await backend.release(grant)


def test_calls_are_bounded_by_op_timeout_on_our_side() -> None:
    # (no driver and its retries in between: a link sends once, its timer bounds the call)
    backend = backend_of_unopened(aiodlock.connect("redis://127.0.0.1:1/0", op_timeout=0.7).backend)
    links, pubsub = connect_deployment(backend.settings, backend.config)
    assert isinstance(links, ServerLinks)
    assert links.link.op_timeout == pubsub.op_timeout == 0.7


def backend_of_unopened(backend: Any) -> Any:
    from aiodlock.backends.redis import RedisBackend

    assert isinstance(backend, RedisBackend)
    return backend


async def test_keys_are_prefixed_by_namespace_and_db_is_honoured(
    make_client: ClientFactory, redis_server: RedisServer, raw_factory: RawFactory
) -> None:
    url = redis_server.url_for(3)
    c = await make_client(url, namespace="app.one")
    raw3 = raw_factory(url)
    async with c.lock("x"):
        assert await raw3.exists(b"app.one:{x}") == 1
        assert await raw_factory().exists(b"app.one:{x}") == 0


async def test_wrong_password_is_a_clear_backend_error(redis_factory: Any) -> None:
    server = redis_factory(password="s3cret-pw")
    for url in (
        f"redis://:wrong-pw@{server.address}/0",
        f"redis://{server.address}/0",
    ):
        client = aiodlock.connect(url, op_timeout=2)
        with pytest.raises(aiodlock.BackendError) as info:
            await client.open()
        assert "authentication failed" in str(info.value)
        assert "wrong-pw" not in str(info.value)
        assert "s3cret-pw" not in str(info.value)
        assert "wrong-pw" not in repr(client)
    async with aiodlock.connect(f"redis://:s3cret-pw@{server.address}/0") as good:
        assert "s3cret-pw" not in repr(good)
        async with good.lock("p") as lease:
            assert lease.token == 1


async def test_unix_socket(redis_factory: Any, tmp_path: Path) -> None:
    path = Path("/tmp") / f"adl-{os.getpid()}-{time.monotonic_ns() % 10**8}.sock"
    try:
        server = redis_factory(extra_args=["--unixsocket", str(path), "--unixsocketperm", "700"])
        client = aiodlock.connect(f"unix://{path}?db=2")
        async with client, client.lock("u") as lease:
            assert lease.token == 1
            assert server.cli("-n", "2", "EXISTS", "aiodlock:{u}") == "1"
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


async def test_a_ready_made_client_is_used_and_left_open(redis_url: str, namespace: str) -> None:
    mine = aioredis.Redis.from_url(redis_url)
    try:
        client = aiodlock.connect("redis://", client=mine, namespace=namespace)
        async with client:
            assert backend_of(client).client is mine
            async with client.lock("ext") as lease:
                assert await mine.hget(f"{namespace}:{{ext}}", lease.owner) is not None
        assert await mine.ping()  # still usable: not ours to close
    finally:
        await mine.aclose()


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("redis://h1:6379,h2:6379/0", {}, "one server"),
        ("redis://localhost/abc", {}, "database number"),
        ("redis+sentinel://h1:26379", {}, "service name"),
        ("redis+sentinel:///mymaster", {}, "sentinels"),
        ("redis+cluster://", {}, "nodes"),
        ("redis+cluster://h1:7000/2", {}, "database 0"),
        ("unix://", {}, "unix:///path"),
        ("redis://localhost/0", {"sync_replicas": -1}, "sync_replicas"),
        ("redis://localhost/0", {"sync_replicas": 1, "sync_timeout": 9}, "sync_timeout"),
        ("redis://localhost/0", {"ssl_ca_certs": "/x"}, "rediss://"),
        ("rediss://localhost/0", {"ssl_cert_reqs": "maybe"}, "ssl_cert_reqs"),
        ("redis://localhost/0", {"client": object()}, "client"),
        ("redis://localhost/0", {"no_such_option": 1}, "no_such_option"),
    ],
)
def test_bad_urls_and_options(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect(url, **options)
    assert message in str(info.value)


def test_client_option_with_a_server_url_is_refused() -> None:
    mine = aioredis.Redis()
    with pytest.raises(aiodlock.ConfigurationError, match="must not name a server"):
        aiodlock.connect("redis://otherhost:6379/0", client=mine)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://", ("server", (("localhost", 6379),), 0, None)),
        ("redis://h:1234/5", ("server", (("h", 1234),), 5, None)),
        ("rediss://:pw@h/1", ("server", (("h", 6379),), 1, None)),
        ("redis+sentinel://a,b:5000/svc", ("sentinel", (("a", 26379), ("b", 5000)), 0, "svc")),
        ("redis+sentinel://a/svc/4", ("sentinel", (("a", 26379),), 4, "svc")),
        ("redis+cluster://a:7000,b:7001", ("cluster", (("a", 7000), ("b", 7001)), 0, None)),
        ("unix:///run/redis.sock?db=3", ("unix", (), 3, None)),
    ],
)
def test_url_forms(url: str, expected: tuple[Any, ...]) -> None:
    backend = backend_of_unopened(aiodlock.connect(url).backend)
    s = backend.settings
    assert (s.mode, s.hosts, s.db, s.service_name) == expected
    assert "pw" not in backend.describe()


async def test_release_wakes_no_one_when_nobody_waits(
    client: aiodlock.Client, raw: aioredis.Redis, namespace: str
) -> None:
    async with client.lock("quiet"):
        pass
    assert await keys_of(raw, namespace) == []


async def test_close_releases_held_locks(make_client: ClientFactory, raw: aioredis.Redis) -> None:
    a = await make_client()
    b = await make_client()
    lease = await a.lock("closing").acquire()
    await a.close()
    assert lease.lost
    await eventually(lambda: b.lock("closing").try_acquire(), what="lock freed by close()")


async def test_tls(redis_factory: Any, tmp_path: Path, raw_factory: RawFactory) -> None:
    ca, cert, key = make_tls_certs(tmp_path)
    tls_port = free_port()
    server = redis_factory(extra_args=tls_server_args(tls_port, ca, cert, key))
    url = f"rediss://127.0.0.1:{tls_port}/0"
    a = aiodlock.connect(url, ssl_ca_certs=str(ca), client_name="tls-a")
    b = aiodlock.connect(url, ssl_ca_certs=str(ca))
    raw = raw_factory(server.url)  # (its plain port)
    async with a, b:
        first = await connection_ids(raw, "tls-a")  # (made by open())
        lock = a.lock("tls")
        await lock.acquire()
        link = backend_of(a).link
        assert link is not None  # the pipelined connection, over TLS
        assert len(first) == 1
        assert await connection_ids(raw, "tls-a") == first
        waiting = asyncio.create_task(b.lock("tls").acquire(timeout=HANG))
        await eventually(lambda: bool(backend_of(b).hub.channels()))
        await lock.release()
        lease = await asyncio.wait_for(waiting, HANG)  # pub/sub over TLS as well
        assert lease.token == 2
    untrusted = aiodlock.connect(url, op_timeout=2)  # the system CAs do not know ours
    with pytest.raises(aiodlock.BackendError):
        await untrusted.open()
