"""URLs, options, the key, and clear errors for a wrong password or a missing database."""

from __future__ import annotations

import pytest

import aiodlock
from aiodlock.backends.postgres import PostgresBackend, lock_key
from aiodlock.backends.postgres.table import PostgresTableBackend
from tests.servers import PostgresServer

from .pg_helpers import backend_of


def test_the_key_is_a_stable_signed_64_bit_hash_of_namespace_and_name() -> None:
    # Fixed values: a key must never change between versions (processes of two versions
    # of aiodlock must take the same lock for a name).
    assert lock_key("aiodlock", "job") == -85551890520420678
    assert lock_key("aiodlock", "job\x00") == 5692940029438868050
    assert lock_key("ns", "job") == 6685389420177948942
    assert -(2**63) <= lock_key("x", "\udcff lone surrogate") < 2**63


def test_url_forms_and_the_password_is_never_shown() -> None:
    client = aiodlock.connect("postgresql://alice:s3cr%40t@db.example:6543/locks?sslmode=require")
    backend = backend_of(client)
    assert (backend.host, backend.port, backend.database) == ("db.example", 6543, "locks")
    assert backend.user == "alice"
    assert backend.sslmode == "require"
    shown = f"{client!r} {backend!r} {backend.describe()}"
    assert "s3cr" not in shown
    assert "postgresql://alice:***@db.example:6543/locks?sslmode=require" in shown
    alias = backend_of(aiodlock.connect("postgres://h/db"))
    assert isinstance(alias, PostgresBackend)
    assert (alias.host, alias.port, alias.user) == ("h", 5432, None)


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("strategy=lock", "strategy"),
        ("sslmode=sometimes", "sslmode"),
        ("poll_interval=0", "poll_interval"),
        ("listen_idle=0", "listen_idle"),
        ("listen_idle=soon", "listen_idle"),
        ("bogus=1", "bogus"),
    ],
)
def test_bad_options_are_named(query: str, needle: str) -> None:
    with pytest.raises(aiodlock.ConfigurationError, match=needle):
        aiodlock.connect(f"postgresql://u:pw@h/db?{query}")


def test_several_hosts_are_refused() -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="one host"):
        aiodlock.connect("postgresql://h1,h2/db")


def test_the_strategy_picks_the_backend() -> None:
    table = aiodlock.connect("postgresql://u:s3cr%40t@h/db?strategy=table&sslmode=require")
    assert isinstance(table.backend, PostgresTableBackend)
    assert table.backend.strategy == "table"
    shown = f"{table!r} {table.backend.describe()}"
    assert "postgresql://u:***@h:5432/db?sslmode=require&strategy=table" in shown
    assert "s3cr" not in shown
    backend = backend_of(aiodlock.connect("postgresql://u:pw@h/db?strategy=advisory"))
    assert backend.strategy == "advisory"
    with pytest.raises(aiodlock.ConfigurationError, match="pool_size"):
        aiodlock.connect("postgresql://u:pw@h/db?strategy=table&pool_size=0")
    with pytest.raises(aiodlock.ConfigurationError, match=r"option.*'table'"):  # (advisory's)
        aiodlock.connect("postgresql://u:pw@h/db?strategy=table&table=x")


STRATEGIES = pytest.mark.parametrize("strategy", ["advisory", "table"])


@STRATEGIES
async def test_a_wrong_password_is_a_clear_error(
    postgres_server: PostgresServer, strategy: str
) -> None:
    url = f"postgresql://postgres:not-the-Pw9@{postgres_server.address}/postgres"
    url += f"?strategy={strategy}"
    client = aiodlock.connect(url, op_timeout=3)
    with pytest.raises(aiodlock.BackendError) as info:
        await client.open()
    text = str(info.value)
    assert "password authentication failed" in text
    assert "not-the-Pw9" not in text
    assert not info.value.transient


@STRATEGIES
async def test_a_missing_database_is_a_clear_error(
    postgres_server: PostgresServer, strategy: str
) -> None:
    url = postgres_server.url.rsplit("/", 1)[0] + f"/no_such_db?strategy={strategy}"
    client = aiodlock.connect(url, op_timeout=3)
    with pytest.raises(aiodlock.BackendError, match='database "no_such_db" does not exist'):
        await client.open()


@STRATEGIES
async def test_sslmode(postgres_server: PostgresServer, namespace: str, strategy: str) -> None:
    # The test server speaks no TLS: "disable" works, "require" says why it cannot.
    url = f"{postgres_server.url}?strategy={strategy}&sslmode="
    async with (
        aiodlock.connect(url + "disable", namespace=namespace) as client,
        client.lock("tls"),
    ):
        pass
    client = aiodlock.connect(url + "require", op_timeout=3)
    with pytest.raises(aiodlock.BackendError, match=r"(?i)ssl"):
        await client.open()
