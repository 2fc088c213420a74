"""What both strategies take from a ``postgresql://`` URL: the server, the credentials (the
password never shown), TLS, the connection itself, and the one translation of asyncpg's
errors."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import quote

import asyncpg

from ..._errors import ConfigurationError, translating
from ..._types import CommonConfig
from ..._url import ParsedURL, format_host, take_float, take_str

__all__ = ["CREATE_RACE", "SSLMODES", "STRATEGIES", "Settings"]

DEFAULT_PORT = 5432
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
STRATEGIES = ("advisory", "table")
#: Errors that time can cure: the server restarts, is starting, shut a session down.
#: What ``CREATE ... IF NOT EXISTS`` (or ``ADD COLUMN IF NOT EXISTS``) may raise when two
#: sessions run it at the same moment: the other one made the object, which is what we want.
CREATE_RACE = (
    asyncpg.UniqueViolationError,
    asyncpg.DuplicateObjectError,
    asyncpg.DuplicateTableError,
    asyncpg.DuplicateColumnError,
)
_TRANSIENT = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.InternalClientError,  # (a session the server ended, used before it was noticed)
)


class Settings:
    """The URL and the options every strategy shares (no I/O)."""

    def __init__(self, config: CommonConfig, url: ParsedURL, options: dict[str, Any]) -> None:
        if url.scheme not in ("postgresql", "postgres"):
            raise ConfigurationError(f"not a PostgreSQL URL scheme: {url.scheme!r}")
        self.config = config
        self.scheme = url.scheme
        hosts = url.host_list(DEFAULT_PORT) or [("127.0.0.1", DEFAULT_PORT)]
        if len(hosts) > 1:
            raise ConfigurationError("postgres: one host only (a proxy or a DNS name in front)")
        self.host, self.port = hosts[0]
        self.database = url.path.lstrip("/") or None
        if self.database is not None and "/" in self.database:
            raise ConfigurationError(f"postgres: bad database name in the URL path: {url.path!r}")
        self.user = take_str(options, "user", url.username)
        self.password = take_str(options, "password", url.password)
        self.secrets = (self.password,) if self.password else ()
        self._translators: dict[str, translating] = {}
        strategy = take_str(options, "strategy", "advisory") or "advisory"
        if strategy not in STRATEGIES:
            raise ConfigurationError(
                f"postgres: option 'strategy' must be 'advisory' or 'table', not {strategy!r}"
            )
        self.strategy = strategy
        self.sslmode = take_str(options, "sslmode", None)
        if self.sslmode is not None and self.sslmode not in SSLMODES:
            raise ConfigurationError(
                f"postgres: option 'sslmode' must be one of {', '.join(SSLMODES)}, "
                f"not {self.sslmode!r}"
            )
        self.poll_interval = take_float(options, "poll_interval", 1.0, allow_zero=False)
        #: Seconds a LISTEN session stays open after its client's last waiter left.
        self.listen_idle = take_float(options, "listen_idle", 30.0, allow_zero=False)
        self.application_name = take_str(options, "application_name", "aiodlock") or "aiodlock"

    def describe(self, *extra: str) -> str:
        """The URL, the password masked (``extra``: query items to show)."""
        auth = quote(self.user, safe="") if self.user is not None else ""
        auth += ":***" if self.password is not None else ""
        auth += "@" if auth else ""
        items = [f"sslmode={self.sslmode}"] if self.sslmode else []
        items += extra
        query = f"?{'&'.join(items)}" if items else ""
        where = format_host(self.host, self.port)
        return f"{self.scheme}://{auth}{where}/{quote(self.database or '')}{query}"

    def translate(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The driver's errors as BackendError, naming ``what`` (one object per ``what``,
        kept: it holds no state of a call, and statements of the hot paths enter it)."""
        kept = self._translators.get(what)
        if kept is None:
            kept = self._translators[what] = translating(
                "postgres",
                (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError),
                what=what,
                secrets=self.secrets,
                transient=_TRANSIENT,
            )
        return kept

    async def connect(self, **server_settings: str) -> asyncpg.Connection:
        """A new session (``server_settings``: more run-time parameters of the session)."""
        with self.translate("connect"):
            return await asyncpg.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                database=self.database,
                ssl=self.sslmode,
                timeout=self.config.connect_timeout,
                command_timeout=None,
                statement_cache_size=16,
                server_settings={"application_name": self.application_name, **server_settings},
            )
