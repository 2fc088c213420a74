"""The PostgreSQL dialect of the lock table (:mod:`aiodlock.backends._sql`)."""

from __future__ import annotations

from .._sql import Dialect

__all__ = ["POSTGRES", "PostgresDialect"]


class PostgresDialect(Dialect):
    """Names as ``bytea`` (compared byte for byte: ``"Key"`` and ``"key"`` are two locks; a
    NUL or a lone surrogate is stored as it is), expiries in microseconds of the server's
    clock, rows locked ``FOR UPDATE``, numbered parameters (asyncpg)."""

    name = "postgres"
    placeholder = "$"
    for_update = " FOR UPDATE"
    # (clock_timestamp(): the time now, not the transaction's start as now() is)
    now_expr = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    now_sql = f"SELECT {now_expr}"
    # (two clients inserting one name at once: the second inserts nothing, and its
    # transaction goes on, where a unique violation would abort it; the new row's id)
    insert_suffix = " ON CONFLICT DO NOTHING RETURNING token"

    def create_tables(self, locks: str) -> list[str]:
        # (an identity column: its sequence never hands out a number twice)
        return [
            f"CREATE TABLE IF NOT EXISTS {locks} ("
            " namespace text NOT NULL,"
            " name bytea NOT NULL,"
            " owner text NOT NULL,"
            " token bigint GENERATED ALWAYS AS IDENTITY UNIQUE,"
            " expires_at bigint NOT NULL,"
            " version bigint NOT NULL,"
            " waiting smallint NOT NULL DEFAULT 0,"
            " PRIMARY KEY (namespace, name))",
            f"CREATE INDEX IF NOT EXISTS {locks}_expiry ON {locks} (expires_at)",
        ]

    def create_line(self, line: str) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {line} ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " namespace text NOT NULL,"
            " name bytea NOT NULL,"
            " owner text NOT NULL,"
            " expires_at bigint NOT NULL,"
            " UNIQUE (namespace, name, owner))",
            f"CREATE INDEX IF NOT EXISTS {line}_order ON {line} (namespace, name, id)",
            f"CREATE INDEX IF NOT EXISTS {line}_expiry ON {line} (expires_at)",
        ]

    def sweep_expired(self, table: str, where: str = "") -> str:
        # (no DELETE ... LIMIT; SKIP LOCKED: a row another transaction has locked is its
        # business, and waiting for it could deadlock)
        return (
            f"DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE expires_at < ?"
            f" {where} LIMIT {int(self.sweep_limit)} FOR UPDATE SKIP LOCKED)"
        )


POSTGRES = PostgresDialect()
