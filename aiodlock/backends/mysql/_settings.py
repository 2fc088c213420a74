"""The URL of a MySQL/MariaDB backend, and how a connection is opened."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..._errors import ConfigurationError
from ..._types import CommonConfig
from ..._url import ParsedURL, format_host, take_float, take_int, take_str
from ._driver import DRIVERS, Connection, load

__all__ = ["DEFAULT_PORT", "STRATEGIES", "Settings", "connect"]

DEFAULT_PORT = 3306
#: ``table``: the lock table; ``named``: GET_LOCK on one session per client; ``row``:
#: SELECT ... FOR UPDATE in a transaction held open, one connection per holder and waiter.
STRATEGIES = ("table", "named", "row")
_USAGE = "'mysql://user:password@host:3306/database'"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    host: str
    database: str
    port: int = DEFAULT_PORT
    user: str | None = None
    password: str = dataclasses.field(default="", repr=False)
    scheme: str = "mysql"
    strategy: str = "table"
    driver: str = DRIVERS[0]
    pool_size: int = 10
    poll_min: float = 0.005
    poll_max: float = 0.1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigurationError(
                f"option 'strategy' must be one of {', '.join(map(repr, STRATEGIES))}, "
                f"got {self.strategy!r}"
            )
        if self.driver not in DRIVERS:
            raise ConfigurationError(
                f"option 'driver' must be one of {', '.join(map(repr, DRIVERS))}, "
                f"got {self.driver!r}"
            )
        if not 0 < self.poll_min <= self.poll_max:
            raise ConfigurationError(
                f"options 'poll_min' and 'poll_max' need 0 < poll_min <= poll_max, "
                f"got {self.poll_min} and {self.poll_max}"
            )

    @classmethod
    def from_url(cls, url: ParsedURL, options: dict[str, Any]) -> Settings:
        if len(url.hosts) != 1:
            raise ConfigurationError(f"a mysql URL names one server: {_USAGE}")
        database = url.path[1:] if url.path.startswith("/") else url.path
        if not database or "/" in database:
            raise ConfigurationError(f"a mysql URL needs a database name as its path: {_USAGE}")
        ((host, port),) = url.host_list(DEFAULT_PORT)
        return cls(
            host=host,
            port=port,
            user=url.username,
            password=url.password or "",
            database=database,
            scheme=url.scheme.lower(),
            strategy=take_str(options, "strategy", "table") or "table",
            driver=take_str(options, "driver", DRIVERS[0]) or DRIVERS[0],
            pool_size=take_int(options, "pool_size", 10, minimum=1, maximum=1000),
            poll_min=take_float(options, "poll_min", 0.005, allow_zero=False),
            poll_max=take_float(options, "poll_max", 0.1, allow_zero=False),
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.password,) if self.password else ()

    def describe(self) -> str:
        auth = ""
        if self.user is not None:
            auth = self.user + (":***" if self.password else "") + "@"
        return f"{self.scheme}://{auth}{format_host(self.host, self.port)}/{self.database}"


async def connect(settings: Settings, config: CommonConfig) -> Connection:
    """A new connection (autocommit) with the session settings every strategy needs."""
    conn = await load(settings.driver).connect(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password,
        database=settings.database,
        connect_timeout=config.connect_timeout,
    )
    try:
        async with conn.cursor() as cursor:
            # UTC: UNIX_TIMESTAMP(NOW(6)) is exact; READ COMMITTED: a missing row takes no
            # gap lock, and every read sees the last commit; no notes (CREATE TABLE IF NOT
            # EXISTS of an existing table would cost a SHOW WARNINGS and a Python warning).
            wait = max(1, math.ceil(config.op_timeout))
            await cursor.execute(
                f"SET time_zone = '+00:00', sql_notes = 0, innodb_lock_wait_timeout = {wait:d}"
            )
            await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    except BaseException:
        conn.close()
        raise
    return conn
