"""The settings of the Redis backends' URLs (``redis``, ``rediss``, ``unix``, Sentinel,
Cluster; Redlock's): hosts, database, credentials and TLS, and those of a redis-py client
handed in as ``client=`` (read through its public attributes)."""

from __future__ import annotations

import dataclasses
import functools
import ssl
from collections.abc import Callable
from typing import Any, Literal

from ..._errors import ConfigurationError
from ..._types import CommonConfig
from ..._url import ParsedURL, take_bool, take_float, take_int, take_str

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
SSL_CERT_REQS = ("required", "optional", "none")
SSL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")

Mode = Literal["server", "unix", "sentinel", "cluster"]
_MODES: dict[str, Mode] = {"sentinel": "sentinel", "cluster": "cluster"}


@dataclasses.dataclass(slots=True)
class Settings:
    mode: Mode
    tls: bool
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    sentinel_username: str | None
    sentinel_password: str | None = dataclasses.field(repr=False)
    client_name: str | None
    sync_replicas: int
    sync_timeout: float
    ssl: dict[str, Any]
    client: Any = dataclasses.field(repr=False)
    shown: str
    hosts: tuple[tuple[str, int], ...] = ()
    socket_path: str | None = None
    db: int = 0
    service_name: str | None = None


def parse_settings(url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Settings:
    """The settings of a ``redis``/``rediss``/``unix``/Sentinel/Cluster URL and its options."""
    scheme, path = url.scheme, url.path
    base, _, variant = scheme.partition("+")
    client = options.pop("client", None)
    s = Settings(
        mode="unix" if base == "unix" else _MODES.get(variant, "server"),
        tls=base == "rediss",
        password=take_str(options, "password", url.password),
        username=take_str(options, "username", url.username),
        sentinel_password=take_str(options, "sentinel_password", None),
        sentinel_username=take_str(options, "sentinel_username", None),
        client_name=take_str(options, "client_name", None),
        sync_replicas=take_int(options, "sync_replicas", 0, minimum=0, maximum=100),
        sync_timeout=take_float(
            options, "sync_timeout", min(1.0, config.op_timeout / 2), allow_zero=False
        ),
        ssl={},
        client=client,
        shown=url.redacted() if client is None else f"{scheme}:// (client={type(client).__name__})",
    )
    take_int(options, "max_connections", 0, minimum=0)  # (no effect: one connection a server)
    if s.sync_replicas and s.sync_timeout >= config.op_timeout:
        raise ConfigurationError(
            f"option 'sync_timeout' ({s.sync_timeout:g} s) must be shorter than "
            f"'op_timeout' ({config.op_timeout:g} s): WAIT runs inside one round trip"
        )
    s.ssl = take_ssl_options(options)
    if s.ssl and not s.tls:
        raise ConfigurationError(
            f"TLS options ({', '.join(sorted(s.ssl))}) need a rediss:// URL, not {scheme}://"
        )
    db_option = take_int(options, "db", -1, minimum=0)
    if client is not None:
        if url.hosts or path not in ("", "/") or url.password is not None:
            raise ConfigurationError(
                "with option 'client', the URL must not name a server "
                f"(use '{scheme}://'), got {url.redacted()!r}"
            )
        if s.mode in ("sentinel", "unix"):
            raise ConfigurationError(
                f"option 'client' takes 'redis://' or 'redis+cluster://', not {scheme}://"
            )
        _use_client(s, client)
    elif s.mode == "unix":
        if url.hosts or not path or path == "/":
            raise ConfigurationError(
                "a unix URL is 'unix:///path/to/redis.sock' (options: ?db=N&password=...)"
            )
        s.socket_path = path
    elif s.mode == "server":
        if len(url.hosts) > 1:
            raise ConfigurationError(
                f"a {scheme}:// URL names one server; for several use "
                f"'{base}+cluster://h1:p1,h2:p2', '{base}+sentinel://...' or 'redlock://'"
            )
        s.hosts = tuple(url.host_list(DEFAULT_PORT)) or (("localhost", DEFAULT_PORT),)
        s.db = db_from_path(path)
    elif s.mode == "sentinel":
        if not url.hosts:
            raise ConfigurationError(
                f"a {scheme}:// URL lists the sentinels: "
                f"'{scheme}://h1:26379,h2:26379/service_name'"
            )
        s.hosts = tuple(url.host_list(DEFAULT_SENTINEL_PORT))
        parts = [p for p in path.split("/") if p]
        if not parts or len(parts) > 2:
            raise ConfigurationError(
                f"a {scheme}:// URL ends with the service name: "
                f"'{scheme}://h1:26379,h2:26379/mymaster' (optionally '/mymaster/DB')"
            )
        s.service_name = parts[0]
        s.db = db_from_path("/" + "/".join(parts[1:]))
    else:  # cluster
        if not url.hosts:
            raise ConfigurationError(
                f"a {scheme}:// URL lists one or more nodes: '{scheme}://h1:7000,h2:7001'"
            )
        s.hosts = tuple(url.host_list(DEFAULT_PORT))
        if path not in ("", "/", "/0"):
            raise ConfigurationError(
                f"Redis Cluster has only database 0; remove {path!r} from the URL"
            )
    if db_option >= 0:
        if s.mode == "cluster" and db_option != 0:
            raise ConfigurationError("Redis Cluster has only database 0 (option 'db')")
        s.db = db_option
    return s


def db_from_path(path: str) -> int:
    text = path.strip("/")
    if not text:
        return 0
    if not text.isdigit():
        raise ConfigurationError(f"the URL path must be the database number ('/0'), got {path!r}")
    return int(text)


def ssl_context_factory(options: dict[str, Any]) -> Callable[[], ssl.SSLContext]:
    """The SSL context of these ``ssl_*`` options (by default the certificate is required
    and the host name checked), made on first use (a missing file fails a connection)."""
    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

    @functools.cache
    def make() -> ssl.SSLContext:
        context = ssl.create_default_context()
        verify = reqs[str(options.get("ssl_cert_reqs", "required")).lower()]
        context.check_hostname = bool(options.get("ssl_check_hostname", True)) and bool(verify)
        context.verify_mode = verify
        if options.get("ssl_certfile"):
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
        if options.get("ssl_ca_certs") or options.get("ssl_ca_path"):
            context.load_verify_locations(options.get("ssl_ca_certs"), options.get("ssl_ca_path"))
        return context

    return make


def take_ssl_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the ``ssl_*`` options and check them."""
    files = {name: take_str(options, name, None) for name in SSL_FILES}
    ssl: dict[str, Any] = {name: value for name, value in files.items() if value is not None}
    reqs = take_str(options, "ssl_cert_reqs", None)
    if reqs is not None:
        if reqs.lower() not in SSL_CERT_REQS:
            raise ConfigurationError(
                f"option 'ssl_cert_reqs' must be one of {', '.join(SSL_CERT_REQS)}, got {reqs!r}"
            )
        ssl["ssl_cert_reqs"] = reqs.lower()
    if "ssl_check_hostname" in options:
        ssl["ssl_check_hostname"] = take_bool(options, "ssl_check_hostname", True)
    return ssl


def _use_client(s: Settings, client: Any) -> None:
    """Connect where a redis-py client (``client=``) does, read through its public
    attributes (the client itself is not used: aiodlock speaks over its own connections)."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        kwargs = client.nodes_manager.connection_kwargs
        nodes = client.nodes_manager.startup_nodes.values()
        s.hosts = tuple((node.host, int(node.port)) for node in nodes)
    elif isinstance(client, aioredis.Redis):
        kwargs = client.connection_pool.connection_kwargs
        s.socket_path = path = kwargs.get("path")
        s.hosts = (
            () if path else ((kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))),)
        )
    else:
        raise ConfigurationError(
            "option 'client' must be a redis.asyncio.Redis or "
            f"redis.asyncio.cluster.RedisCluster, not {type(client).__name__}"
        )
    if (s.mode == "cluster") != isinstance(client, RedisCluster):
        raise ConfigurationError(
            "option 'client': use 'redis+cluster://' with a RedisCluster client and "
            "'redis://' with a Redis client"
        )
    s.mode = "unix" if s.socket_path is not None else s.mode
    s.db = int(kwargs.get("db") or 0)
    s.username = s.username or kwargs.get("username")
    s.password = s.password or kwargs.get("password")
    s.client_name = s.client_name or kwargs.get("client_name")
    s.tls = "ssl_cert_reqs" in kwargs or bool(kwargs.get("ssl"))
    if not s.ssl:
        s.ssl = {name: kwargs[name] for name in SSL_FILES if kwargs.get(name)}
        if s.tls:
            reqs = kwargs.get("ssl_cert_reqs", "required")
            names = {ssl.CERT_NONE: "none", ssl.CERT_OPTIONAL: "optional"}
            s.ssl["ssl_cert_reqs"] = names.get(reqs, reqs if isinstance(reqs, str) else "required")
            s.ssl["ssl_check_hostname"] = bool(kwargs.get("ssl_check_hostname", True))


# -- Redlock ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RedlockSettings:
    hosts: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    #: one password per node (URL order), when they differ; else None
    passwords: tuple[str | None, ...] | None = dataclasses.field(repr=False)
    node_timeout: float | None
    drift_factor: float
    retry_delay: float
    rejoin_delay: float
    tls: bool
    ssl: dict[str, Any]
    shown: str


def take_passwords(options: dict[str, Any], nodes: int) -> tuple[str | None, ...] | None:
    """One password (or None) per node, in the URL's order: a keyword argument only (a
    query parameter would put every secret in the URL)."""
    value = options.pop("passwords", None)
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ConfigurationError(
            "option 'passwords' needs a list with one password (or None) per node, in the "
            "URL's order, given as a keyword argument (not in the URL)"
        )
    if len(value) != nodes:
        raise ConfigurationError(
            f"option 'passwords' has {len(value)} entries for {nodes} nodes: give one per "
            f"node, in the URL's order (None for a node without a password)"
        )
    wrong = [
        type(item).__name__ for item in value if item is not None and not isinstance(item, str)
    ]
    if wrong:
        raise ConfigurationError(f"option 'passwords' needs strings (or None), got a {wrong[0]}")
    return tuple(value)


def parse_redlock_settings(
    url: ParsedURL, config: CommonConfig, options: dict[str, Any]
) -> RedlockSettings:
    """The settings of a ``redlock://`` URL and its options."""
    if not url.hosts:
        raise ConfigurationError(
            "a redlock:// URL lists the Redis masters: 'redlock://h1:6379,h2:6379,h3:6379'"
        )
    hosts = tuple(url.host_list(DEFAULT_PORT))
    twice = [host for i, host in enumerate(hosts) if host in hosts[:i]]
    if twice:
        raise ConfigurationError(
            f"redlock:// lists {twice[0][0]}:{twice[0][1]} twice: every node must be a "
            f"different Redis master"
        )
    s = RedlockSettings(
        hosts=hosts,
        db=db_from_path(url.path),
        password=take_str(options, "password", url.password),
        passwords=take_passwords(options, len(hosts)),
        username=take_str(options, "username", url.username),
        node_timeout=take_float(options, "node_timeout", None, allow_zero=False, allow_none=True),
        drift_factor=take_float(options, "drift_factor", 0.01, minimum=0.0),
        retry_delay=take_float(options, "retry_delay", 0.2, allow_zero=False),
        rejoin_delay=take_float(options, "rejoin_delay", 0.0, minimum=0.0),
        tls=take_bool(options, "ssl", False),
        ssl=take_ssl_options(options),
        shown=url.redacted(),
    )
    if s.passwords is not None and s.password is not None:
        raise ConfigurationError(
            "give either 'password' (the same on every node) or 'passwords' (one per "
            "node), not both"
        )
    if s.node_timeout is not None and s.node_timeout * 2 > config.watchdog_ttl:
        raise ConfigurationError(
            f"option 'node_timeout' ({s.node_timeout:g} s) must be far below the lease "
            f"(watchdog_ttl = {config.watchdog_ttl:g} s): at most half of it"
        )
    if s.drift_factor >= 0.5:
        raise ConfigurationError(
            f"option 'drift_factor' must be below 0.5 (0.01 is usual), got {s.drift_factor!r}"
        )
    if s.ssl and not s.tls:
        raise ConfigurationError(
            f"the option(s) {', '.join(sorted(s.ssl))} need ssl=True (TLS to every node)"
        )
    return s
