"""What the session-bound strategies (``named``, ``row``) share: the holders table, which
says who holds a name and on which server session (for ``status``; believed only while that
session holds the lock), and tokens from the counter table (one row per name, never reset;
the table strategy has none: its tokens are its rows' own ids)."""

from __future__ import annotations

from ._driver import Cursor

__all__ = ["COUNTERS", "HOLDERS", "KEY", "holders_ddl", "next_token", "record_holder"]

HOLDERS = "aiodlock_holders"
COUNTERS = "aiodlock_counters"
KEY = "namespace = %s AND name = UNHEX(%s)"
_BUMP = (
    f"INSERT INTO {COUNTERS} (namespace, name, token) VALUES (%s, UNHEX(%s), LAST_INSERT_ID(1)) "
    "ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)"
)
_RECORD = (
    f"REPLACE INTO {HOLDERS} (namespace, name, owner, token, session) "
    "VALUES (%s, UNHEX(%s), %s, %s, %s)"
)


def holders_ddl() -> list[str]:
    """The holders table and the counter table."""
    holders = (
        f"CREATE TABLE IF NOT EXISTS {HOLDERS} ("
        " namespace VARBINARY(64) NOT NULL,"
        " name VARBINARY(2048) NOT NULL,"
        " owner VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
        " token BIGINT NOT NULL,"
        " session BIGINT NOT NULL,"
        " PRIMARY KEY (namespace, name)"
        ") ENGINE=InnoDB"
    )
    counters = (
        f"CREATE TABLE IF NOT EXISTS {COUNTERS} ("
        " namespace VARBINARY(64) NOT NULL,"
        " name VARBINARY(2048) NOT NULL,"
        " token BIGINT NOT NULL,"
        " PRIMARY KEY (namespace, name)"
        ") ENGINE=InnoDB"
    )
    return [holders, counters]


async def next_token(cursor: Cursor, namespace: str, key: str) -> int:
    """The name's next fencing token, in ONE statement (autocommit: committed at once)."""
    await cursor.execute(_BUMP, (namespace, key))
    return int(cursor.lastrowid)


async def record_holder(
    cursor: Cursor, namespace: str, key: str, owner: str, token: int, session: int
) -> None:
    await cursor.execute(_RECORD, (namespace, key, owner, token, session))
