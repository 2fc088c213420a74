"""The MySQL / MariaDB dialect of the lock table (:mod:`aiodlock.backends._sql`)."""

from __future__ import annotations

from typing import Any

from .._sql import Dialect

__all__ = ["MYSQL", "MySQLDialect"]

#: The longest stored name: 512 characters (the core's limit) of at most 4 UTF-8 bytes.
NAME_BYTES = 2048


class MySQLDialect(Dialect):
    """InnoDB: names as VARBINARY (compared byte for byte: ``"Key"`` and ``"key"`` are two
    locks), expiries in microseconds of the server's clock, rows locked ``FOR UPDATE``."""

    name = "mysql"
    placeholder = "%s"
    for_update = " FOR UPDATE"
    # (the session's time zone is UTC, so that UNIX_TIMESTAMP(NOW(6)) is exact)
    now_expr = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    now_sql = f"SELECT {now_expr}"
    # (every connection is opened with CLIENT.MULTI_STATEMENTS: see _driver)
    batches = True
    begin_sql = "START TRANSACTION"
    # NOTE: a name travels as hex text: aiomysql 0.3 cannot send a bytes parameter with
    # PyMySQL >= 1.2 (it imports PyMySQL's removed escape_bytes_prefixed), and hex text is
    # still a parameter, never a name formatted into the SQL.
    name_sql = "UNHEX(?)"

    def name_param(self, key: bytes) -> Any:
        return key.hex()

    def create_tables(self, locks: str, counters: str) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {locks} ("
            " namespace VARBINARY(64) NOT NULL,"
            f" name VARBINARY({NAME_BYTES}) NOT NULL,"
            " owner VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " token BIGINT NOT NULL,"
            " expires_at BIGINT NOT NULL,"
            " version BIGINT NOT NULL,"
            " PRIMARY KEY (namespace, name),"
            f" KEY {locks}_expiry (expires_at)"
            ") ENGINE=InnoDB",
            f"CREATE TABLE IF NOT EXISTS {counters} ("
            " namespace VARBINARY(64) NOT NULL,"
            f" name VARBINARY({NAME_BYTES}) NOT NULL,"
            " token BIGINT NOT NULL,"
            " PRIMARY KEY (namespace, name)"
            ") ENGINE=InnoDB",
        ]

    def create_line(self, line: str) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {line} ("
            " id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
            " namespace VARBINARY(64) NOT NULL,"
            f" name VARBINARY({NAME_BYTES}) NOT NULL,"
            " owner VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " expires_at BIGINT NOT NULL,"
            f" KEY {line}_order (namespace, name, id),"
            f" KEY {line}_expiry (expires_at)"
            ") ENGINE=InnoDB",
        ]

    def bump_counter(self, counters: str) -> str:
        return (
            f"INSERT INTO {counters} (namespace, name, token) VALUES (?, {self.name_sql}, 1) "
            f"ON DUPLICATE KEY UPDATE token = token + 1"
        )

    def insert_select(self, table: str, columns: str, select: str, on_duplicate: str) -> str:
        return f"INSERT INTO {table} ({columns}) {select} ON DUPLICATE KEY UPDATE {on_duplicate}"

    def bump_if_inserted(self, counters: str) -> tuple[str, str]:
        # ROW_COUNT(): the rows the statement before changed (1: the INSERT inserted; 0: its
        # ON DUPLICATE KEY no-op; no connection asks for CLIENT.FOUND_ROWS, which would make
        # that no-op 1 too and waste a token number, no more).  LAST_INSERT_ID(x) keeps x
        # for this session (the one new row with token 0 exists only if this ran).
        return (
            f"INSERT INTO {counters} (namespace, name, token) "
            f"VALUES (?, {self.name_sql}, LAST_INSERT_ID(1)) "
            f"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + (ROW_COUNT() = 1))",
            "LAST_INSERT_ID()",
        )

    def sweep_expired(self, locks: str) -> str:
        return f"DELETE FROM {locks} WHERE expires_at < ? LIMIT {int(self.sweep_limit)}"


MYSQL = MySQLDialect()
