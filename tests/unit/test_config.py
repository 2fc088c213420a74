"""URLs, options, the registry and the public surface."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import aiodlock
from aiodlock._registry import known_schemes, load_backend
from aiodlock._url import parse_url
from aiodlock.backends._base import Backend


def test_public_surface_is_pinned() -> None:
    assert sorted(aiodlock.__all__) == sorted(
        [
            "BackendError",
            "BackendTimeout",
            "Client",
            "ConfigurationError",
            "Lease",
            "Lock",
            "LockError",
            "LockLost",
            "LockNotOwned",
            "LockStatus",
            "LockTimeout",
            "Observer",
            "OnLost",
            "Unsupported",
            "__version__",
            "connect",
            "default_url",
        ]
    )
    for name in aiodlock.__all__:
        assert hasattr(aiodlock, name), name


def test_exception_tree() -> None:
    assert issubclass(aiodlock.ConfigurationError, aiodlock.LockError)
    assert issubclass(aiodlock.ConfigurationError, ValueError)
    assert issubclass(aiodlock.LockTimeout, TimeoutError)
    assert issubclass(aiodlock.LockTimeout, aiodlock.LockError)
    assert issubclass(aiodlock.BackendTimeout, aiodlock.BackendError)
    assert issubclass(aiodlock.BackendTimeout, TimeoutError)
    for exc in (aiodlock.Unsupported, aiodlock.LockNotOwned, aiodlock.LockLost):
        assert issubclass(exc, aiodlock.LockError)
        assert not issubclass(exc, TimeoutError)


def test_parse_several_hosts_and_ipv6() -> None:
    url = parse_url("redlock://h1:6379,h2,[::1]:7000/2?x=1&y=")
    assert url.scheme == "redlock"
    assert url.hosts == (("h1", 6379), ("h2", None), ("::1", 7000))
    assert url.host_list(6379) == [("h1", 6379), ("h2", 6379), ("::1", 7000)]
    assert url.path == "/2"
    assert dict(url.query) == {"x": "1", "y": ""}


def test_password_never_shown() -> None:
    url = parse_url("redis://user:s3cr%40t@host:6379/0")
    assert url.password == "s3cr@t"
    assert url.username == "user"
    for text in (repr(url), str(url), url.redacted()):
        assert "s3cr" not in text
        assert "***" in text or "s3cr" not in text
    client = aiodlock.connect("memory://space")
    assert "memory://space" in repr(client)


def test_password_not_in_errors() -> None:
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect("nosuch://user:hunter2@host/")
    assert "hunter2" not in str(info.value)
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect("user:hunter2@host")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("nosuch://x", "unknown URL scheme 'nosuch'"),
        ("not a url", "not a URL"),
        ("redis://h:99999", "bad port"),
        ("redis://h:abc", "bad port"),
        ("redlock://h1,,h2", "empty host"),
        ("memory://x?a=1&a=2", "more than once"),
        ("memory://a/path", "memory URL"),
    ],
)
def test_bad_urls(url: str, fragment: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=fragment):
        aiodlock.connect(url)


def test_unknown_scheme_lists_known_ones() -> None:
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect("oracle://x")
    known = str(info.value).partition("known schemes: ")[2].split(", ")
    for scheme in ("memory", "sqlite", "redis", "redlock", "zookeeper", "postgresql"):
        assert scheme in known
    # Only schemes whose backend exists: each one loads.
    assert known == known_schemes()
    for scheme in known:
        assert issubclass(load_backend(scheme), Backend), scheme


def test_url_type_checked() -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="must be a str"):
        aiodlock.connect(b"memory://x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"watchdog_ttl": -1}, "watchdog_ttl"),
        ({"watchdog_ttl": "soon"}, "watchdog_ttl"),
        ({"watchdog_ttl": True}, "watchdog_ttl"),
        ({"watchdog_ttl": float("nan")}, "watchdog_ttl"),
        ({"op_timeout": 0}, "op_timeout"),
        ({"connect_timeout": "x"}, "connect_timeout"),
        ({"namespace": ""}, "namespace"),
        ({"namespace": "a/b"}, "namespace"),
        ({"namespace": 3}, "namespace"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=fragment):
        aiodlock.connect("memory://opts", **options)


def test_options_from_query_and_keywords() -> None:
    client = aiodlock.connect("memory://q?watchdog_ttl=2.5&namespace=app1&op_timeout=1")
    assert client.config.watchdog_ttl == 2.5
    assert client.config.namespace == "app1"
    assert client.config.op_timeout == 1.0
    client = aiodlock.connect("memory://q?watchdog_ttl=2.5", watchdog_ttl=4)
    assert client.config.watchdog_ttl == 4.0
    with pytest.raises(aiodlock.ConfigurationError, match="bogus"):
        aiodlock.connect("memory://q?bogus=1")


def test_client_ids_are_unique() -> None:
    ids = {aiodlock.connect("memory://ids").id for _ in range(50)}
    assert len(ids) == 50


def test_default_url_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AIODLOCK_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert aiodlock.default_url() == f"sqlite:///{tmp_path}/aiodlock/locks.db"
    monkeypatch.setenv("AIODLOCK_URL", "memory://from-env")
    assert aiodlock.default_url() == "memory://from-env"
    assert "memory://from-env" in repr(aiodlock.connect())


@pytest.mark.parametrize(
    ("scheme", "extra", "module"),
    [
        ("redis", "redis", "hiredis"),
        ("redlock", "redlock", "hiredis"),
        ("zookeeper", "zookeeper", "aiozk"),
    ],
)
def test_missing_extra_names_the_pip_command(scheme: str, extra: str, module: str) -> None:
    # A fresh interpreter where the driver cannot be imported.
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"
        "import aiodlock\n"
        "try:\n"
        f"    aiodlock.connect('{scheme}://127.0.0.1:1')\n"
        "except aiodlock.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert f'pip install "aiodlock[{extra}]"' in out, out
