"""The one seam between the MySQL backend and its driver: ``aiomysql`` (the default) or
``asyncmy`` (``?driver=asyncmy``).

Both have the same shape (PyMySQL's): ``connect(...)`` in autocommit, ``conn.cursor()``,
``begin`` / ``commit`` / ``rollback``, ``cursor.execute`` with ``%s`` parameters that the
driver escapes, ``lastrowid`` (the id an INSERT made), and errors whose ``args`` are
``(code, message)``.  What differs is here: how a connection is opened, the
driver's base error class, and how a closed connection shows.  Everything else is shared.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..._errors import ConfigurationError

__all__ = ["DRIVERS", "Connection", "Cursor", "Driver", "driver_errors", "error_code", "load"]

#: The drivers ``driver=`` accepts; the first is the default.
DRIVERS = ("aiomysql", "asyncmy")

#: A driver's connection (aiomysql's or asyncmy's: the same methods, no common base class).
Connection = Any
#: A cursor of such a connection.
Cursor = Any

#: The base error classes of the drivers loaded so far (see :func:`driver_errors`).
_ERRORS: list[type[Exception]] = []


@dataclasses.dataclass(frozen=True, slots=True)
class Driver:
    """How to open a connection with one driver, and what its errors look like."""

    name: str
    #: ``connect(host=, port=, user=, password=, database=, connect_timeout=)``: a new
    #: connection in autocommit mode.
    connect: Callable[..., Awaitable[Connection]]
    #: The driver's base error (``args``: ``(code, message)``).
    error: type[Exception]
    #: ``is_closed(conn)``: the connection was closed (by us or after a failure).
    is_closed: Callable[[Connection], bool]
    #: ``await cursor(conn)``: a new cursor of ``conn``.
    cursor: Callable[[Connection], Awaitable[Cursor]]


def _aiomysql() -> Driver:
    import aiomysql
    import pymysql

    async def connect(*, database: str, **kwargs: Any) -> Connection:
        return await aiomysql.connect(
            db=database,
            charset="utf8mb4",
            autocommit=True,
            **kwargs,
        )

    async def cursor(conn: Connection) -> Cursor:
        return await conn.cursor()

    return Driver(
        "aiomysql", connect, pymysql.err.MySQLError, lambda conn: bool(conn.closed), cursor
    )


def _asyncmy() -> Driver:
    import asyncmy
    import asyncmy.errors

    async def connect(**kwargs: Any) -> Connection:
        return await asyncmy.connect(
            charset="utf8mb4",
            autocommit=True,
            **kwargs,
        )

    async def cursor(conn: Connection) -> Cursor:
        return conn.cursor()

    return Driver(
        "asyncmy", connect, asyncmy.errors.MySQLError, lambda conn: not conn.connected, cursor
    )


@functools.cache
def load(name: str) -> Driver:
    """The driver ``name`` (one of :data:`DRIVERS`), imported on first use."""
    if name not in DRIVERS:
        raise ConfigurationError(
            f"option 'driver' must be one of {', '.join(map(repr, DRIVERS))}, got {name!r}"
        )
    try:
        importlib.import_module(name)
    except ImportError as exc:
        extra = "mysql" if name == "aiomysql" else "asyncmy"
        raise ConfigurationError(
            f"the mysql backend's driver {name!r} is not installed: pip install 'aiodlock[{extra}]'"
        ) from exc
    driver = _aiomysql() if name == "aiomysql" else _asyncmy()
    _ERRORS.append(driver.error)
    return driver


def driver_errors() -> tuple[type[Exception], ...]:
    """The base error classes of every driver loaded in this process."""
    return tuple(_ERRORS)


def error_code(exc: BaseException) -> int | None:
    """The MySQL error code of a driver's error (server: 1000-1999, client: 2000-2999)."""
    if isinstance(exc, tuple(_ERRORS)) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None
