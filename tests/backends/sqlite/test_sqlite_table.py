"""The driver-agnostic lock-table scripts of ``aiodlock.backends._sql``.

They run here on stdlib sqlite3, once through the blocking driver loop and once through
the async one (which the MySQL backend uses), and the dialect hooks are checked.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from aiodlock._types import Busy
from aiodlock.backends._sql import (
    Behind,
    Dialect,
    Granted,
    Held,
    Insert,
    LockTable,
    Script,
    encode_name,
    run_script,
    run_script_async,
)
from aiodlock.backends.sqlite import SQLITE


@pytest.fixture
def conn(tmp_path: Path) -> Any:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    table = LockTable(SQLITE, "ns")
    for statement in table.schema():
        conn.execute(statement)
    yield conn
    conn.close()


def run(conn: sqlite3.Connection, script: Script[Any]) -> Any:
    conn.execute("BEGIN IMMEDIATE")
    result = run_script(conn.execute, script)
    conn.execute("COMMIT")
    return result


async def run_async(conn: sqlite3.Connection, script: Script[Any]) -> Any:
    async def execute(sql: str, params: tuple[Any, ...]) -> tuple[int, list[Any]]:
        cursor = conn.execute(sql, params)
        return cursor.rowcount, cursor.fetchall()

    async def insert(sql: str, params: tuple[Any, ...]) -> int | None:
        cursor = conn.execute(sql, params)
        return cursor.lastrowid if cursor.rowcount == 1 else None

    return await run_script_async(execute, script, insert)


def test_the_whole_cycle_through_the_blocking_driver(conn: sqlite3.Connection) -> None:
    table = LockTable(SQLITE, "ns")
    assert run(conn, table.probe("n", "a")) is None
    assert run(conn, table.attempt("n", "a", 10)) == Granted(1)
    assert run(conn, table.attempt("n", "a", 10)) == Granted(1, refreshed=True)
    busy = run(conn, table.probe("n", "b"))
    assert isinstance(busy, Busy)
    assert busy.retry_after is not None
    assert 9 < busy.retry_after <= 10
    assert isinstance(run(conn, table.attempt("n", "b", 10)), Busy)
    held = run(conn, table.status("n"))
    assert isinstance(held, Held)
    assert (held.owner, held.token) == ("a", 1)
    assert run(conn, table.renew([("n", "a", 1), ("n", "b", 1), ("n", "a", 2)], 20)) == [
        True,
        False,
        False,
    ]
    assert run(conn, table.release("n", "a", 2)) is False
    assert run(conn, table.release("n", "a", 1)) is True
    assert run(conn, table.status("n")) is None
    assert run(conn, table.attempt("n", "b", 10)) == Granted(2)
    assert run(conn, table.abandon("n", "a")) is False
    assert run(conn, table.force_release("n")) is True
    assert run(conn, table.force_release("n")) is False


async def test_the_same_scripts_through_the_async_driver(conn: sqlite3.Connection) -> None:
    table = LockTable(SQLITE, "ns")
    assert await run_async(conn, table.attempt("n", "a", 10)) == Granted(1)
    assert isinstance(await run_async(conn, table.attempt("n", "b", 10)), Busy)
    assert await run_async(conn, table.renew([("n", "a", 1)], 5)) == [True]
    assert await run_async(conn, table.abandon("n", "a")) is True
    assert await run_async(conn, table.attempt("n", "b", 10)) == Granted(2)


def test_rows_of_other_namespaces_are_untouched(conn: sqlite3.Connection) -> None:
    a, b = LockTable(SQLITE, "a"), LockTable(SQLITE, "b")
    assert run(conn, a.attempt("n", "x", 10)) == Granted(1)
    assert run(conn, b.attempt("n", "y", 10)) == Granted(2)  # (one sequence of row ids)
    assert run(conn, b.force_release("n")) is True
    held = run(conn, a.status("n"))
    assert isinstance(held, Held)
    assert (held.owner, held.token) == ("x", 1)
    assert 9 < held.expires_in <= 10


def test_names_are_stored_as_exact_bytes() -> None:
    assert encode_name("a\x00b") == b"a\x00b"
    assert encode_name("\ud800") == b"\xed\xa0\x80"
    assert encode_name("Key") != encode_name("key")


class _FormatDialect(Dialect):
    """A dialect like MySQL's: %s placeholders, row locks, a server clock."""

    name = "fmt"
    placeholder = "%s"
    for_update = " FOR UPDATE"
    now_sql = "SELECT server_micros()"

    def create_tables(self, locks: str) -> list[str]:
        return [f"CREATE TABLE {locks} (x)"]

    def sweep_expired(self, table: str, where: str = "") -> str:
        return f"DELETE FROM {table} WHERE expires_at < ? {where}LIMIT {self.sweep_limit}"

    def create_line(self, line: str) -> list[str]:
        return [f"CREATE TABLE {line} (z)"]


def test_a_second_dialect_shapes_every_statement() -> None:
    table = LockTable(_FormatDialect(), "ns", locks="my_locks", line="my_line")
    script = table.attempt("n", "a", 1.5)
    first = script.send(None)
    assert first.sql == "SELECT server_micros()"  # the server clock, not the local one
    select = script.send([(1_000_000,)])
    assert select.sql.endswith(" FOR UPDATE")
    assert "%s" in select.sql
    assert "?" not in select.sql
    assert select.params == ("ns", b"n")
    head = script.send([])  # no row
    assert head.sql.startswith("SELECT owner FROM my_line")
    assert head.params == ("ns", b"n", 1_000_000)
    insert = script.send([])  # nobody in line: a plain INSERT, nobody waiting
    assert isinstance(insert, Insert)
    assert insert.sql.startswith("INSERT INTO my_locks")
    assert insert.params == ("ns", b"n", "a", 2_500_000, 0)
    sweep = script.send(7)  # the new row's id: the token
    assert sweep.sql.startswith("DELETE FROM my_locks WHERE expires_at < %s AND")
    assert "NOT EXISTS (SELECT 1 FROM my_line" in sweep.sql
    assert sweep.params == (1_000_000, 1_000_000)
    with pytest.raises(StopIteration) as done:
        script.send(0)
    assert done.value.value == Granted(7)
    assert table.schema() == ["CREATE TABLE my_locks (x)", "CREATE TABLE my_line (z)"]


def test_table_names_are_checked() -> None:
    with pytest.raises(ValueError, match="table name"):
        LockTable(SQLITE, "ns", locks="locks; DROP TABLE x")


def _row(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT owner, token, waiting FROM aiodlock_locks").fetchall()


def test_a_line_keeps_the_row_and_the_release_vacates_it(conn: sqlite3.Connection) -> None:
    table = LockTable(SQLITE, "ns")
    first = run(conn, table.attempt("n", "a", 10))
    assert isinstance(first, Granted)
    assert _row(conn) == [("a", first.token, 0)]
    # A waiter that joins the line marks the row: a release must not simply delete it.
    assert isinstance(run(conn, table.attempt("n", "f", 10, queue=5)), Busy)
    assert _row(conn) == [("a", first.token, 1)]
    assert run(conn, table.release("n", "a", first.token)) is True
    assert [r[0] for r in _row(conn)] == [""]  # vacant: the row stays for the line
    assert run(conn, table.status("n")) is None  # (a vacant row is free)
    # Nobody else takes it: the plain INSERT would hit the key; the scripts say who is first.
    assert run(conn, table.probe("n", "b")) == Busy()
    assert run(conn, table.attempt("n", "b", 10)) == Behind("f")
    served = run(conn, table.attempt("n", "f", 10, queue=5))
    assert isinstance(served, Granted)
    assert served.token > first.token
    assert _row(conn) == [("f", served.token, 0)]  # (nobody else in line)
    assert run(conn, table.release("n", "f", served.token)) is True
    assert _row(conn) == []


def test_a_vacant_row_goes_with_its_last_waiter(conn: sqlite3.Connection) -> None:
    table = LockTable(SQLITE, "ns")
    held = run(conn, table.attempt("n", "a", 10))
    assert isinstance(held, Granted)
    assert isinstance(run(conn, table.attempt("n", "f", 10, queue=5)), Busy)
    assert run(conn, table.release("n", "a", held.token)) is True
    assert run(conn, table.abandon("n", "f")) is True
    assert _row(conn) == []
    # A waiter that died in line: once its place runs out, anyone takes the vacant row over.
    held = run(conn, table.attempt("n", "a", 10))
    assert isinstance(held, Granted)
    assert isinstance(run(conn, table.attempt("n", "dead", 10, queue=5)), Busy)
    assert run(conn, table.force_release("n")) is True  # (vacated for "dead")
    assert run(conn, table.attempt("n", "b", 10)) == Behind("dead")
    conn.execute("UPDATE aiodlock_waiters SET expires_at = 0")
    taken = run(conn, table.attempt("n", "b", 10))
    assert isinstance(taken, Granted)
    assert taken.token > held.token


def test_the_sweep_keeps_a_row_whose_line_is_alive(conn: sqlite3.Connection) -> None:
    table = LockTable(SQLITE, "ns")
    held = run(conn, table.attempt("kept", "a", 10))
    assert isinstance(held, Granted)
    assert isinstance(run(conn, table.attempt("kept", "f", 10, queue=60)), Busy)
    assert run(conn, table.release("kept", "a", held.token)) is True  # (vacant, expired)
    conn.execute(
        "INSERT INTO aiodlock_locks (namespace, name, owner, expires_at, version)"
        " VALUES ('ns', x'64', 'dead', 0, 1)"
    )
    assert isinstance(run(conn, table.attempt("other", "b", 10)), Granted)  # (it sweeps)
    names = {r[0] for r in conn.execute("SELECT name FROM aiodlock_locks")}
    assert names == {b"kept", b"other"}  # the dead holder's row went, the line's stayed
