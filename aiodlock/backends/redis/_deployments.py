"""How the Redis backend reaches its deployment: URL settings, TLS, Sentinel, Cluster."""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
from collections.abc import Callable
from typing import Any, Literal

import anyio
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, RedisSSLContext
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisClusterException

from ..._errors import ConfigurationError
from ..._url import ParsedURL, take_bool, take_float, take_int, take_str
from .._base import CommonConfig
from ._node import AnyRedis, no_retry
from ._scripts import ALL_SCRIPTS
from ._wire import Address, Link

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379

Mode = Literal["server", "unix", "sentinel", "cluster"]


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    mode: Mode
    tls: bool
    hosts: tuple[tuple[str, int], ...]
    socket_path: str | None
    db: int
    service_name: str | None
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    sentinel_username: str | None
    sentinel_password: str | None = dataclasses.field(repr=False)
    client_name: str | None
    max_connections: int | None
    ssl: dict[str, Any]
    sync_replicas: int
    sync_timeout: float
    client: Any = dataclasses.field(repr=False)
    shown: str


SSL_CERT_REQS = ("required", "optional", "none")


def parse_settings(url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Settings:
    """The settings of a ``redis``/``rediss``/``unix``/Sentinel/Cluster URL and its options."""
    scheme = url.scheme
    base, _, variant = scheme.partition("+")
    tls = base == "rediss"
    mode: Mode
    if base == "unix":
        mode = "unix"
    elif variant == "sentinel":
        mode = "sentinel"
    elif variant == "cluster":
        mode = "cluster"
    else:
        mode = "server"

    client = options.pop("client", None)
    if client is not None and not isinstance(client, aioredis.Redis | RedisCluster):
        raise ConfigurationError(
            "option 'client' must be a redis.asyncio.Redis or "
            f"redis.asyncio.cluster.RedisCluster, not {type(client).__name__}"
        )
    password = take_str(options, "password", url.password, secret=True)
    username = take_str(options, "username", url.username)
    sentinel_password = take_str(options, "sentinel_password", None, secret=True)
    sentinel_username = take_str(options, "sentinel_username", None)
    client_name = take_str(options, "client_name", None)
    max_connections = take_int(options, "max_connections", 0, minimum=0) or None
    sync_replicas = take_int(options, "sync_replicas", 0, minimum=0, maximum=100)
    sync_timeout = take_float(
        options, "sync_timeout", min(1.0, config.op_timeout / 2), allow_zero=False
    )
    assert sync_timeout is not None
    if sync_replicas and sync_timeout >= config.op_timeout:
        raise ConfigurationError(
            f"option 'sync_timeout' ({sync_timeout:g} s) must be shorter than "
            f"'op_timeout' ({config.op_timeout:g} s): WAIT runs inside one round trip"
        )
    ssl = take_ssl_options(options)
    if ssl and not tls:
        raise ConfigurationError(
            f"TLS options ({', '.join(sorted(ssl))}) need a rediss:// URL, not {scheme}://"
        )

    db_option = take_int(options, "db", -1, minimum=0)
    hosts: tuple[tuple[str, int], ...] = ()
    socket_path: str | None = None
    service_name: str | None = None
    db = 0
    path = url.path
    if client is not None:
        if url.hosts or path not in ("", "/") or url.password is not None:
            raise ConfigurationError(
                "with option 'client', the URL must not name a server "
                f"(use '{scheme}://'), got {url.redacted()!r}"
            )
        if mode in ("sentinel", "unix"):
            raise ConfigurationError(
                f"option 'client' takes 'redis://' or 'redis+cluster://', not {scheme}://"
            )
        if (mode == "cluster") != isinstance(client, RedisCluster):
            raise ConfigurationError(
                "option 'client': use 'redis+cluster://' with a RedisCluster client and "
                "'redis://' with a Redis client"
            )
    elif mode == "unix":
        if url.hosts or not path or path == "/":
            raise ConfigurationError(
                "a unix URL is 'unix:///path/to/redis.sock' (options: ?db=N&password=...)"
            )
        socket_path = path
    elif mode == "server":
        if len(url.hosts) > 1:
            raise ConfigurationError(
                f"a {scheme}:// URL names one server; for several use "
                f"'{base}+cluster://h1:p1,h2:p2', '{base}+sentinel://...' or 'redlock://'"
            )
        hosts = tuple(url.host_list(DEFAULT_PORT)) or (("localhost", DEFAULT_PORT),)
        db = db_from_path(path)
    elif mode == "sentinel":
        if not url.hosts:
            raise ConfigurationError(
                f"a {scheme}:// URL lists the sentinels: "
                f"'{scheme}://h1:26379,h2:26379/service_name'"
            )
        hosts = tuple(url.host_list(DEFAULT_SENTINEL_PORT))
        parts = [p for p in path.split("/") if p]
        if not parts or len(parts) > 2:
            raise ConfigurationError(
                f"a {scheme}:// URL ends with the service name: "
                f"'{scheme}://h1:26379,h2:26379/mymaster' (optionally '/mymaster/DB')"
            )
        service_name = parts[0]
        if len(parts) == 2:
            db = db_from_path("/" + parts[1])
    else:  # cluster
        if not url.hosts:
            raise ConfigurationError(
                f"a {scheme}:// URL lists one or more nodes: '{scheme}://h1:7000,h2:7001'"
            )
        hosts = tuple(url.host_list(DEFAULT_PORT))
        if path not in ("", "/", "/0"):
            raise ConfigurationError(
                f"Redis Cluster has only database 0; remove {path!r} from the URL"
            )
    if db_option >= 0:
        if mode == "cluster" and db_option != 0:
            raise ConfigurationError("Redis Cluster has only database 0 (option 'db')")
        db = db_option

    shown = url.redacted() if client is None else f"{scheme}:// (client={type(client).__name__})"
    return Settings(
        mode=mode,
        tls=tls,
        hosts=hosts,
        socket_path=socket_path,
        db=db,
        service_name=service_name,
        username=username,
        password=password,
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
        client_name=client_name,
        max_connections=max_connections,
        ssl=ssl,
        sync_replicas=sync_replicas,
        sync_timeout=sync_timeout,
        client=client,
        shown=shown,
    )


def connection_kwargs(
    *,
    username: str | None = None,
    password: str | None = None,
    connect_timeout: float = 5.0,
    client_name: str | None = None,
    max_connections: int | None = None,
    ssl: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for a redis.asyncio client (or pool) the way aiodlock wants it.

    No driver retries, no socket timeout (each call is bounded by ``op_timeout`` on
    aiodlock's side: one timer instead of redis-py's timer per read and task per write),
    bytes replies.  ``ssl``: TLS options (see :func:`take_ssl_options`), ``None`` for none.
    """
    kwargs: dict[str, Any] = {
        "username": username,
        "password": password,
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout,
        "retry": no_retry(),
        "health_check_interval": 0,
        "decode_responses": False,
    }
    if client_name is not None:
        kwargs["client_name"] = client_name
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    if ssl is not None:
        kwargs["ssl"] = True
        kwargs.update(ssl)
    return kwargs


async def open_pubsub_connection(client: AnyRedis, index: int = 0) -> AbstractConnection:
    """A new connection for a :class:`PubSubHub`, made like the client's own connections.

    On a Cluster it goes to the ``index``-th master (round robin over reconnects; classic
    PUBLISH reaches every node of a cluster); through Sentinel it goes to the current master.
    """
    conn: AbstractConnection
    if isinstance(client, RedisCluster):
        await client.initialize()
        nodes = client.get_primaries() or client.get_nodes()
        if not nodes:
            raise RedisClusterException("no cluster node known")
        node = nodes[index % len(nodes)]
        kwargs = dict(node.connection_kwargs)
        kwargs["retry"] = no_retry()
        conn = node.connection_class(**kwargs)
    else:
        conn = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        raise
    return conn


def db_from_path(path: str) -> int:
    text = path.strip("/")
    if not text:
        return 0
    if not text.isdigit():
        raise ConfigurationError(f"the URL path must be the database number ('/0'), got {path!r}")
    return int(text)


def ssl_context_factory(options: dict[str, Any]) -> Callable[[], ssl.SSLContext]:
    """The SSL context redis-py would make from these ``ssl_*`` options (its defaults: the
    certificate required, the host name checked), made on first use."""
    context = RedisSSLContext(
        keyfile=options.get("ssl_keyfile"),
        certfile=options.get("ssl_certfile"),
        cert_reqs=options.get("ssl_cert_reqs", "required"),
        ca_certs=options.get("ssl_ca_certs"),
        ca_path=options.get("ssl_ca_path"),
        check_hostname=options.get("ssl_check_hostname", True),
    )
    return context.get


def take_ssl_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the ``ssl_*`` options (for ``rediss`` URLs) and check them."""
    ssl: dict[str, Any] = {}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path"):
        value = take_str(options, name, None)
        if value is not None:
            ssl[name] = value
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


def build_client(s: Settings, config: CommonConfig) -> tuple[AnyRedis, Sentinel | None]:
    """The redis.asyncio client of the deployment (and the Sentinel object behind it)."""
    if s.client is not None:
        client: AnyRedis = s.client
        return client, None
    kwargs = connection_kwargs(
        username=s.username,
        password=s.password,
        connect_timeout=config.connect_timeout,
        client_name=s.client_name,
        max_connections=s.max_connections,
        ssl=s.ssl if s.tls else None,
    )
    if s.mode == "cluster":
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in s.hosts], **kwargs
        )
        return cluster, None
    if s.mode == "sentinel":
        assert s.service_name is not None
        sentinel_kwargs: dict[str, Any] = {
            "username": s.sentinel_username,
            "password": s.sentinel_password,
            "socket_timeout": config.op_timeout,
            "socket_connect_timeout": config.connect_timeout,
            "retry": no_retry(),
        }
        if s.tls:
            sentinel_kwargs["ssl"] = True
            sentinel_kwargs.update(s.ssl)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(s.hosts), sentinel_kwargs=sentinel_kwargs, db=s.db, **kwargs
        )
        master: aioredis.Redis = sentinel.master_for(s.service_name)
        return master, sentinel
    if s.mode == "unix":
        kwargs.pop("socket_connect_timeout", None)
        kwargs.pop("ssl", None)
        return aioredis.Redis(unix_socket_path=s.socket_path, db=s.db, **kwargs), None
    host, port = s.hosts[0]
    return aioredis.Redis(host=host, port=port, db=s.db, **kwargs), None


def build_link(s: Settings, config: CommonConfig) -> Link | None:
    """The pipelined connection for one plain server (``redis://``, ``unix://``).

    Also for ``rediss://`` (the SSL context is redis-py's, made from the same options).
    Not for Sentinel (redis-py's pool follows the master), Cluster (redis-py routes by
    slot), a client of the caller's, or ``sync_replicas`` (a ``WAIT`` blocks its
    connection on the server, and would hold up every other request on a shared one).
    """
    if s.client is not None or s.sync_replicas or s.mode not in ("server", "unix"):
        return None
    if s.mode == "unix":
        assert s.socket_path is not None
        address = Address(path=s.socket_path)
    else:
        host, port = s.hosts[0]
        address = Address(host, port, tls=ssl_context_factory(s.ssl) if s.tls else None)
    return Link(
        "redis",
        address,
        connect_timeout=config.connect_timeout,
        op_timeout=config.op_timeout,
        username=s.username,
        password=s.password,
        db=s.db,
        client_name=s.client_name,
        scripts=ALL_SCRIPTS,
    )


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
    """The ``passwords`` option: one password (or None) per node, in the URL's order.

    A keyword argument only (a list): a query parameter would put every secret in the URL.
    """
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
    for item in value:
        if item is not None and not isinstance(item, str):
            raise ConfigurationError(
                f"option 'passwords' needs strings (or None), got a {type(item).__name__}"
            )
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
    seen: set[tuple[str, int]] = set()
    for host in hosts:
        if host in seen:
            raise ConfigurationError(
                f"redlock:// lists {host[0]}:{host[1]} twice: every node must be a "
                f"different Redis master"
            )
        seen.add(host)
    path = url.path.strip("/")
    if path and not path.isdigit():
        raise ConfigurationError(
            f"the redlock:// URL path must be a database number ('/0'), got {url.path!r}"
        )
    db = int(path) if path else 0
    password = take_str(options, "password", url.password, secret=True)
    passwords = take_passwords(options, len(hosts))
    if passwords is not None and password is not None:
        raise ConfigurationError(
            "give either 'password' (the same on every node) or 'passwords' (one per "
            "node), not both"
        )
    username = take_str(options, "username", url.username)
    node_timeout = take_float(options, "node_timeout", None, allow_zero=False, allow_none=True)
    if node_timeout is not None and node_timeout * 2 > config.watchdog_ttl:
        raise ConfigurationError(
            f"option 'node_timeout' ({node_timeout:g} s) must be far below the lease "
            f"(watchdog_ttl = {config.watchdog_ttl:g} s): at most half of it"
        )
    drift_factor = take_float(options, "drift_factor", 0.01, minimum=0.0)
    assert drift_factor is not None
    if drift_factor >= 0.5:
        raise ConfigurationError(
            f"option 'drift_factor' must be below 0.5 (0.01 is usual), got {drift_factor!r}"
        )
    retry_delay = take_float(options, "retry_delay", 0.2, allow_zero=False)
    assert retry_delay is not None
    rejoin_delay = take_float(options, "rejoin_delay", 0.0, minimum=0.0)
    assert rejoin_delay is not None
    tls = take_bool(options, "ssl", False)
    ssl = take_ssl_options(options)
    if ssl and not tls:
        raise ConfigurationError(
            f"the option(s) {', '.join(sorted(ssl))} need ssl=True (TLS to every node)"
        )
    return RedlockSettings(
        hosts=hosts,
        db=db,
        username=username,
        password=password,
        passwords=passwords,
        node_timeout=node_timeout,
        drift_factor=drift_factor,
        retry_delay=retry_delay,
        rejoin_delay=rejoin_delay,
        tls=tls,
        ssl=ssl,
        shown=url.redacted(),
    )
