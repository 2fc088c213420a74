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
    # NOTE: a name travels as hex text: aiomysql 0.3 cannot send a bytes parameter with
    # PyMySQL >= 1.2 (it imports PyMySQL's removed escape_bytes_prefixed), and hex text is
    # still a parameter, never a name formatted into the SQL.
    name_sql = "UNHEX(?)"

    def name_param(self, key: bytes) -> Any:
        return key.hex()

    def create_tables(self, locks: str) -> list[str]:
        # (the token: InnoDB's auto-increment, persisted by MariaDB >= 10.2.4 and MySQL 8)
        return [
            f"CREATE TABLE IF NOT EXISTS {locks} ("
            " namespace VARBINARY(64) NOT NULL,"
            f" name VARBINARY({NAME_BYTES}) NOT NULL,"
            " owner VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " token BIGINT NOT NULL AUTO_INCREMENT,"
            " expires_at BIGINT NOT NULL,"
            " version BIGINT NOT NULL,"
            " waiting TINYINT NOT NULL DEFAULT 0,"
            " PRIMARY KEY (namespace, name),"
            f" UNIQUE KEY {locks}_token (token),"
            f" KEY {locks}_expiry (expires_at)"
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

    def sweep_expired(self, table: str, where: str = "") -> str:
        return f"DELETE FROM {table} WHERE expires_at < ? {where} LIMIT {int(self.sweep_limit)}"


MYSQL = MySQLDialect()
