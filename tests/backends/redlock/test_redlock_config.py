"""redlock:// URLs and options (no server needed, except where a test opens a client)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

import aiodlock
from aiodlock._types import Capability
from aiodlock.backends.redis import RedlockBackend
from tests.servers import RedisGroup

from .redlock_helpers import backend_of

pytestmark = pytest.mark.redis


def backend(url: str, **options: object) -> RedlockBackend:
    return backend_of(aiodlock.connect(url, **options))


def test_hosts_ports_and_quorum() -> None:
    b = backend("redlock://h1:7001,h2,[::1]:7003/2")
    assert b.settings.hosts == (("h1", 7001), ("h2", 6379), ("::1", 7003))
    assert b.settings.db == 2
    assert b.quorum == 2
    assert backend("redlock://a").quorum == 1
    assert backend("redlock://a,b").quorum == 2
    assert backend("redlock://a,b,c,d,e").quorum == 3
    assert backend("redlock://a,b,c,d,e,f").quorum == 4


def test_defaults() -> None:
    b = backend("redlock://a,b,c")
    s = b.settings
    assert s.drift_factor == 0.01
    assert s.retry_delay == 0.2
    assert s.rejoin_delay == 0.0
    assert s.node_timeout is None
    # node_timeout: min(50 ms, ttl / 100), at least 10 ms
    assert b.node_timeout(30.0) == pytest.approx(0.05)
    assert b.node_timeout(3.0) == pytest.approx(0.03)
    assert b.node_timeout(0.5) == pytest.approx(0.01)
    # drift: ttl * drift_factor + 2 ms
    assert b.drift(10.0) == pytest.approx(0.102)
    assert b.capabilities & Capability.CROSS_PROCESS
    assert not b.capabilities & Capability.FAIR


def test_options_from_query_and_keywords() -> None:
    b = backend(
        "redlock://a,b,c?node_timeout=0.02&drift_factor=0.05&retry_delay=0.5",
        rejoin_delay=30,
    )
    s = b.settings
    assert (s.node_timeout, s.drift_factor, s.retry_delay, s.rejoin_delay) == (0.02, 0.05, 0.5, 30)
    assert b.node_timeout(30.0) == 0.02
    assert b.node_timeout(0.5) == 0.02


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("redlock://", {}, "lists the Redis masters"),
        ("redlock://a:1,a:1", {}, "twice"),
        ("redlock://a/x", {}, "database number"),
        ("redlock://a", {"node_timeout": 0}, "node_timeout"),
        ("redlock://a", {"node_timeout": "fast"}, "node_timeout"),
        ("redlock://a", {"node_timeout": 20, "watchdog_ttl": 30}, "far below"),
        ("redlock://a", {"drift_factor": -0.1}, "drift_factor"),
        ("redlock://a", {"drift_factor": 0.5}, "drift_factor"),
        ("redlock://a", {"retry_delay": 0}, "retry_delay"),
        ("redlock://a", {"rejoin_delay": -1}, "rejoin_delay"),
        ("redlock://a", {"no_such_option": 1}, "no_such_option"),
        ("redlock://a?sync_replicas=1", {}, "sync_replicas"),
        ("redlock://a", {"ssl_ca_certs": "/ca.crt"}, "need ssl=True"),
        ("redlock://a", {"ssl": True, "ssl_cert_reqs": "maybe"}, "ssl_cert_reqs"),
        ("redlock://a,b", {"passwords": ["x"]}, "1 entries for 2 nodes"),
        ("redlock://a,b", {"passwords": "x,y"}, "keyword argument"),
        ("redlock://a?passwords=x", {}, "keyword argument"),
        ("redlock://a", {"passwords": [b"x"]}, "strings"),
        ("redlock://:p@a", {"passwords": ["x"]}, "not both"),
    ],
)
def test_bad_configuration(url: str, options: dict[str, object], match: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=match):
        aiodlock.connect(url, **options)


def test_fair_is_unsupported() -> None:
    client = aiodlock.connect("redlock://a,b,c")
    with pytest.raises(aiodlock.Unsupported):
        client.lock("x", fair=True)


def test_password_is_never_shown() -> None:
    client = aiodlock.connect("redlock://user:s3cret-pw@a:1,b:2,c:3")
    b = backend_of(client)
    assert b.settings.password == "s3cret-pw"
    assert b.settings.username == "user"
    for text in (repr(client), repr(b), b.describe(), repr(b.settings)):
        assert "s3cret-pw" not in text
    assert "***" in b.describe()
    b2 = backend("redlock://a,b,c", password="kw-secret")
    assert b2.settings.password == "kw-secret"
    assert "kw-secret" not in repr(b2)


def test_per_node_passwords_are_never_shown() -> None:
    b = backend("redlock://a,b,c", passwords=["pw-one", None, "pw-three"])
    assert b.settings.passwords == ("pw-one", None, "pw-three")
    assert b.secrets == ("pw-one", "pw-three")
    for text in (repr(b), b.describe(), repr(b.settings)):
        assert "pw-one" not in text
        assert "pw-three" not in text


async def test_per_node_passwords(
    redis_many: Callable[..., RedisGroup], caplog: pytest.LogCaptureFixture
) -> None:
    group = redis_many(3, password="pw-0")
    for index in (1, 2):  # every node its own password
        raw = aioredis.Redis(host=group[index].host, port=group[index].port, password="pw-0")
        await raw.config_set("requirepass", f"pw-{index}")
        await raw.aclose()
    right = ["pw-0", "pw-1", "pw-2"]
    client = aiodlock.connect("redlock://" + group.hosts, passwords=right, connect_timeout=3)
    async with client, client.lock("per-node") as lease:
        assert lease.token >= 1
        assert await client.status("per-node") is not None
    # One node's password wrong: a minority fails (a warning that shows no password), the
    # other two still make a majority.
    caplog.set_level(logging.WARNING, logger="aiodlock")
    wrong = ["pw-0", "pw-1", "not-this-one"]
    client = aiodlock.connect("redlock://" + group.hosts, passwords=wrong, connect_timeout=3)
    async with client, client.lock("per-node") as lease:
        assert lease.token >= 2
    warnings = [r.getMessage() for r in caplog.records]
    assert any("is not answering" in m and "auth" in m.lower() for m in warnings), warnings
    assert not any(p in m for m in warnings for p in (*right, "not-this-one"))


async def test_open_fails_without_a_majority() -> None:
    # Ports 1-3 on loopback: nothing listens, connections are refused at once.
    client = aiodlock.connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", connect_timeout=2)
    with pytest.raises(aiodlock.BackendError, match="only 0 of 3 nodes answered"):
        await client.open()


async def test_wrong_password_is_a_clear_backend_error(
    redis_many: Callable[..., RedisGroup],
) -> None:
    group = redis_many(3, password="right-one")
    url = "redlock://:wrong-one@" + group.hosts
    client = aiodlock.connect(url, connect_timeout=3)
    with pytest.raises(aiodlock.BackendError) as info:
        await client.open()
    assert "wrong-one" not in str(info.value)
    good = aiodlock.connect("redlock://:right-one@" + group.hosts, connect_timeout=3)
    async with good, good.lock("pw") as lease:
        assert lease.token >= 1


async def test_some_nodes_down_at_open_is_only_a_warning(
    redis_many: Callable[..., RedisGroup], caplog: pytest.LogCaptureFixture
) -> None:
    group = redis_many(3)
    group[2].kill()
    caplog.set_level(logging.WARNING, logger="aiodlock")
    client = aiodlock.connect("redlock://" + group.hosts, connect_timeout=3)
    async with client, client.lock("x") as lease:
        assert lease.token >= 1
    assert any("is not answering" in r.getMessage() for r in caplog.records)
