"""URL forms, options, name encoding and queue order (no server needed)."""

from __future__ import annotations

import pytest
from aiozk import ACL, protocol

import aiodlock
from aiodlock.backends.zookeeper import ZooKeeperBackend, escape_segment, unescape_segment
from aiodlock.backends.zookeeper._paths import order as queue_order
from aiodlock.backends.zookeeper._paths import parse_child


def backend(url: str, **options: object) -> ZooKeeperBackend:
    client = aiodlock.connect(url, **options)
    assert isinstance(client.backend, ZooKeeperBackend)
    return client.backend


# -- URLs and options ------------------------------------------------------------------------


def test_hosts_chroot_and_defaults() -> None:
    b = backend("zookeeper://h1:2182,h2,[::1]:2183/app/locks%20x")
    assert b.hosts == [("h1", 2182), ("h2", 2181), ("::1", 2183)]
    assert b.chroot == "/app/locks x"
    assert b.lock_path("a").startswith("/app/locks x/aiodlock/locks/")
    assert b.requested_session_timeout == 30.0  # watchdog_ttl
    assert b.acl_name == "open"
    assert backend("zk://").hosts == [("127.0.0.1", 2181)]
    assert backend("zk://h/").chroot == ""


def test_session_timeout_follows_watchdog_ttl_unless_given() -> None:
    assert backend("zk://h", watchdog_ttl=7).requested_session_timeout == 7.0
    assert backend("zk://h?session_timeout=2.5", watchdog_ttl=7).requested_session_timeout == 2.5
    with pytest.raises(aiodlock.ConfigurationError, match="session_timeout"):
        backend("zk://h?session_timeout=0")
    with pytest.raises(aiodlock.ConfigurationError, match="session_timeout"):
        backend("zk://h?session_timeout=soon")


def test_digest_credentials_from_url_or_options_are_hidden() -> None:
    b = backend("zookeeper://alice:s3cr%40t@h1:2181/root")
    assert b.username == "alice"
    assert b.auth == [("digest", b"alice:s3cr@t")]
    client = aiodlock.connect("zookeeper://alice:s3cr%40t@h1:2181/root")
    for text in (repr(client), repr(client.backend), client.backend.describe()):
        assert "s3cr" not in text
        assert "alice:***@" in text
    b = backend("zk://h", username="bob", password="pw")
    assert b.auth == [("digest", b"bob:pw")]
    assert "pw" not in b.describe()


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("zk://alice@h", {}, "both a user name and a password"),
        ("zk://h", {"password": "x"}, "both a user name and a password"),
        ("zk://a:b:c@h", {}, None),  # "b:c" is the password: fine
        ("zk://h", {"acl": "creator"}, "needs digest credentials"),
        ("zk://h", {"acl": "nobody"}, "option 'acl'"),
        ("zk://h", {"acl": 3}, "option 'acl'"),
        ("zk://h", {"acl": ["x"]}, "aiozk.ACL"),
        ("zk://h/a/../b", {}, "chroot"),
        ("zk://h/a/%00", {}, "chroot"),
        ("zk://h", {"retries": 3}, "unknown option"),
    ],
)
def test_bad_configuration(url: str, options: dict[str, object], match: str | None) -> None:
    if match is None:
        backend(url, **options)
        return
    with pytest.raises(aiodlock.ConfigurationError, match=match):
        backend(url, **options)


def test_acl_presets_and_custom_list() -> None:
    b = backend("zk://u:p@h", acl="creator_read")
    assert b.acl == [protocol.AUTHED_UNRESTRICTED, protocol.WORLD_READABLE]
    custom = [ACL.make("ip", "127.0.0.1", read=True, write=True, create=True)]
    assert backend("zk://h", acl=custom).acl == custom
    assert backend("zk://h", acl=custom).acl_name == "custom"


def test_capabilities() -> None:
    caps = ZooKeeperBackend.capabilities
    cap = aiodlock.backends._base.Capability
    for flag in (cap.FAIR, cap.ALWAYS_FAIR, cap.FENCING, cap.SESSION_LEASE, cap.CROSS_PROCESS):
        assert caps & flag


# -- names as path segments ------------------------------------------------------------------

NAMES = [
    "orders:42",
    "a/b/c",
    "/",
    ".",
    "..",
    "...x",
    " spaced name ",
    "tab\tnew\nline",
    "nul\x00byte",
    "Ключ-ü-鍵-🔒",
    "100%",
    "#hash#",
    "lone\ud800surrogate",
    "zookeeper",
    "x" * 512,
    "🔒" * 512,
]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_escape_is_one_safe_segment_and_reversible(name: str) -> None:
    segment = escape_segment(name)
    assert unescape_segment(segment) == name
    assert segment not in ("", ".", "..")
    assert "/" not in segment
    assert "#" not in segment  # the separator of owner, attempt and sequence
    assert all(32 < ord(ch) < 127 for ch in segment)


def test_escape_is_injective_and_case_sensitive() -> None:
    segments = {escape_segment(name) for name in [*NAMES, "Key", "key", "key ", "%41", "A"]}
    assert len(segments) == len(NAMES) + 5


# -- the queue order -------------------------------------------------------------------------


def child(owner: str, seq: int) -> str:
    text = f"-{(-seq):09d}" if seq < 0 else f"{seq:010d}"
    return f"{escape_segment(owner)}#abcd0123#{text}"


def test_order_is_by_sequence_number_not_by_name() -> None:
    names = [child("zzz", 3), child("aaa", 10), child("mmm", 1), "foreign-node", "x#y#notnum"]
    order = [c.name for c in queue_order(names)]
    assert order == [child("mmm", 1), child("zzz", 3), child("aaa", 10)]


def test_order_survives_the_sequence_counter_wrapping() -> None:
    # ZooKeeper's counter is a signed 32-bit int: after 2**31-1 come negative numbers.
    names = [child("c", -2147483647), child("a", 2147483646), child("b", 2147483647)]
    assert [unescape_segment(c.owner) for c in queue_order(names)] == ["a", "b", "c"]
    names = [child("d", 1), child("b", -2), child("c", -1), child("a", -3)]
    assert [unescape_segment(c.owner) for c in queue_order(names)] == ["a", "b", "c", "d"]


def test_parse_child_keeps_the_escaped_owner() -> None:
    parsed = parse_child(child("host-1:7", 12))
    assert parsed is not None
    assert unescape_segment(parsed.owner) == "host-1:7"
    assert parsed.seq == 12
    assert parse_child("plain") is None
