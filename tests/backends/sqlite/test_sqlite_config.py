"""URL forms, options and the embedded default of the SQLite backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import aiodlock
from aiodlock._types import Capability
from aiodlock.backends.sqlite import SQLiteBackend

from .sqlite_helpers import ClientFactory, backend_of


def test_relative_path_is_relative_to_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = aiodlock.connect("sqlite:///sub/locks.db")
    assert backend_of(client).path == str(tmp_path / "sub" / "locks.db")


def test_four_slashes_is_an_absolute_path(tmp_path: Path) -> None:
    client = aiodlock.connect(f"sqlite:///{tmp_path}/locks.db")  # "sqlite:////tmp/..."
    backend = backend_of(client)
    assert backend.path == str(tmp_path / "locks.db")
    assert backend.describe() == f"sqlite:///{tmp_path}/locks.db"
    assert str(tmp_path) in repr(client)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqlite://", "file path"),
        ("sqlite:///", "file path"),
        ("sqlite:////", "file path"),
        ("sqlite:///some/dir/", "file path"),
        ("sqlite://localhost/locks.db", "no host"),
        ("sqlite://host:1234/locks.db", "no host"),
        ("sqlite:///:memory:", "memory"),
        ("sqlite:///file:x.db", "URI filenames"),
        ("sqlite:///file:x?mode=memory", "URI filenames"),
    ],
)
def test_bad_urls(url: str, words: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=words):
        aiodlock.connect(url)


def test_a_password_in_a_bad_url_is_never_shown() -> None:
    with pytest.raises(aiodlock.ConfigurationError) as info:
        aiodlock.connect("sqlite://user:s3cret@/x.db")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"poll_min": 0},
        {"poll_min": "abc"},
        {"poll_min": 1.0, "poll_max": 0.5},
        {"busy_timeout": -1},
        {"busy_timeout": 0},
        {"synchronous": "sometimes"},
        {"no_such_option": 1},
    ],
)
def test_bad_options(tmp_path: Path, options: dict[str, object]) -> None:
    with pytest.raises(aiodlock.ConfigurationError):
        aiodlock.connect(f"sqlite:///{tmp_path}/x.db", **options)


def test_options_from_the_query_string(tmp_path: Path) -> None:
    client = aiodlock.connect(
        f"sqlite:///{tmp_path}/x.db?poll_min=0.01&poll_max=2&busy_timeout=1"
        f"&synchronous=NORMAL&op_timeout=3"
    )
    backend = backend_of(client)
    assert (backend.poll_min, backend.poll_max) == (0.01, 2.0)
    assert backend.busy_timeout == 1.0
    assert backend.synchronous == "normal"
    # busy_timeout defaults to op_timeout and never exceeds it
    default = aiodlock.connect(f"sqlite:///{tmp_path}/x.db", op_timeout=2)
    assert backend_of(default).busy_timeout == 2
    capped = aiodlock.connect(f"sqlite:///{tmp_path}/x.db", op_timeout=2, busy_timeout=9)
    assert backend_of(capped).busy_timeout == 2


def test_fair_locks_and_the_starvation_bound_are_supported(tmp_path: Path) -> None:
    # (the order itself: tests/contract's test_fair_locks_grant_in_request_order)
    client = aiodlock.connect(f"sqlite:///{tmp_path}/x.db")
    assert SQLiteBackend.capabilities & Capability.FAIR
    assert SQLiteBackend.capabilities & Capability.URGENT
    client.lock("a", fair=True)
    client.lock("a", fair=False)


async def test_default_url_honours_xdg_cache_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "xdg-cache"
    monkeypatch.delenv("AIODLOCK_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    expected = cache / "aiodlock" / "locks.db"
    assert aiodlock.default_url() == f"sqlite:///{expected}"
    client = aiodlock.connect()
    assert backend_of(client).path == str(expected)
    assert not expected.parent.exists()  # connect() does no I/O
    async with client, client.lock("default") as lease:
        assert lease.token == 1
    assert expected.is_file()  # open() created the directory and the database


@pytest.mark.parametrize("odd", ["a#b", "what?", "x?y#z+%20 ü"])
async def test_default_url_takes_a_cache_dir_with_url_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: str
) -> None:
    # A "?" or "#" in the cache path would end the URL's path: the default then names the
    # file in the percent-encoded option 'path', and the file is exactly there.
    cache = tmp_path / odd
    monkeypatch.delenv("AIODLOCK_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    expected = cache / "aiodlock" / "locks.db"
    url = aiodlock.default_url()
    if "?" in odd or "#" in odd:
        assert url.startswith("sqlite://?path=/")
    client = aiodlock.connect()
    assert backend_of(client).path == str(expected)
    async with client, client.lock("odd") as lease:
        assert lease.token == 1
    assert expected.is_file()
    assert not (tmp_path / "a").exists()  # nothing made at a truncated path


def test_the_path_option_names_any_file(tmp_path: Path) -> None:
    target = tmp_path / "q?h#p+.db"
    client = aiodlock.connect("sqlite://", path=str(target))  # a keyword: taken as is
    assert backend_of(client).path == str(target)
    # what the client describes itself with names the same file
    assert backend_of(aiodlock.connect(backend_of(client).describe())).path == str(target)
    encoded = str(target).replace("%", "%25").replace("?", "%3F").replace("#", "%23")
    client = aiodlock.connect("sqlite://?path=" + encoded.replace("+", "%2B"))
    assert backend_of(client).path == str(target)
    with pytest.raises(aiodlock.ConfigurationError, match="'path', not both"):
        aiodlock.connect(f"sqlite:///{tmp_path}/x.db", path=str(target))
    with pytest.raises(aiodlock.ConfigurationError, match="needs a file path"):
        aiodlock.connect("sqlite://?path=")


async def test_aiodlock_url_wins_over_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "unused"))
    monkeypatch.setenv("AIODLOCK_URL", f"sqlite:///{tmp_path}/env.db")
    assert backend_of(aiodlock.connect()).path == str(tmp_path / "env.db")


async def test_open_fails_cleanly_on_a_file_that_is_not_a_database(
    tmp_path: Path, make_client: ClientFactory
) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not a database file at all" * 100)
    with pytest.raises(aiodlock.BackendError) as info:
        await make_client(f"sqlite:///{bad}")
    assert info.value.__cause__ is not None


async def test_open_fails_cleanly_when_the_directory_cannot_be_made(
    tmp_path: Path, make_client: ClientFactory
) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(aiodlock.BackendError):
        await make_client(f"sqlite:///{tmp_path}/afile/sub/locks.db")
    assert not (tmp_path / "afile" / "sub").exists()


async def test_a_file_with_two_hard_links_is_refused_and_a_symlink_is_fine(
    tmp_path: Path,
) -> None:
    # Each link name would get a -wal/-shm pair of its own: two processes opening the file
    # by different names would not exclude each other.
    first = tmp_path / "locks.db"
    async with aiodlock.connect(f"sqlite:///{first}") as client:
        assert await client.lock("job").try_acquire() is not None
    os.link(first, tmp_path / "other.db")
    for path in (first, tmp_path / "other.db"):
        client = aiodlock.connect(f"sqlite:///{path}")
        with pytest.raises(aiodlock.ConfigurationError, match="2 hard links"):
            await client.open()
        assert not client.is_open
    os.unlink(tmp_path / "other.db")
    os.symlink(first, tmp_path / "alias.db")
    async with aiodlock.connect(f"sqlite:///{tmp_path / 'alias.db'}") as client:
        lease = await client.lock("job").try_acquire()
        assert lease is not None
        assert lease.token == 2  # the same file as before
