"""How the Redis backends reach their servers: URL settings, TLS, one server, Sentinel,
Cluster (the slot map, one link per master, redirections).  (redis-py only for ``client=``.)"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import functools
import itertools
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, TypeAlias

from ..._errors import ConfigurationError
from ..._types import CommonConfig, monotonic
from ..._url import ParsedURL, take_bool, take_float, take_int, take_str
from ._scripts import ALL_SCRIPTS
from ._wire import (
    Address,
    Link,
    NodeConnectionError,
    OnReply,
    ReplyError,
    ScriptCall,
    Target,
    collector,
    hello,
    pack,
)

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


SLOTS: Final = 16384


def key_slot(key: bytes) -> int:
    """The Cluster slot of ``key`` (CRC16/XMODEM of its hash tag, as Redis computes it)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) % SLOTS


class ClusterLinks:
    """A Redis Cluster: one link per master, a call routed by its first key's slot (every
    key of a lock shares one hash tag).  The slot map (``CLUSTER SLOTS``) is read again in
    the background, at most every ``REFRESH`` seconds, after a ``MOVED`` or ``CLUSTERDOWN``
    answer or a node that failed; a ``MOVED`` / ``ASK`` answer sends the call where it points.
    """

    REFRESH: Final = 0.25

    def __init__(self, seeds: Sequence[Address], make_link: Callable[[Address, str], Link]) -> None:
        self._seeds, self._make_link = list(seeds), make_link
        self._tls = seeds[0].tls if seeds else None
        self._slots: list[Address | None] = [None] * SLOTS
        self._links: dict[tuple[Address, str], Link] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed = -1e9
        self._round = itertools.count()

    def address_of(self, key: bytes) -> Address | None:
        return self._slots[key_slot(key)]

    def link_to(self, address: Address, label: str = "redis") -> Link:
        link = self._links.get((address, label))
        if link is None:
            link = self._links[(address, label)] = self._make_link(address, label)
        return link

    async def refresh(self) -> None:
        """Read the slot map from a node (a known master first, then the seeds)."""
        self._refreshed = monotonic()
        failures = []
        for address in dict.fromkeys([*self.masters(), *self._seeds]):
            reply = await self.link_to(address).call(pack(b"CLUSTER", b"SLOTS"))
            if isinstance(reply, list) and reply:
                break
            failures.append(f"{address}: {reply}")
        else:
            raise NodeConnectionError(f"no cluster node gave its slot map: {'; '.join(failures)}")
        slots: list[Address | None] = [None] * SLOTS
        for entry in reply:
            first, last, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if master[0] else address.host
            if host != "?":
                node = Address(host, int(master[1]), tls=self._tls)
                slots[first : last + 1] = [node] * (last - first + 1)
        self._slots = slots

    def reset(self) -> None:
        """Read the slot map again soon (in the background, at most every REFRESH s)."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_later())

    async def _refresh_later(self) -> None:
        await asyncio.sleep(max(0.0, self._refreshed + self.REFRESH - monotonic()))
        try:
            await self.refresh()
        except ConnectionError:
            pass  # (the next failure asks again)

    async def next_master(self) -> Address:
        """A master for the pub/sub connection (round robin over reconnects: a classic
        PUBLISH reaches every node of a cluster)."""
        turn = next(self._round)
        if turn:
            self.reset()
        masters = self.masters()
        if not masters:
            await self.refresh()
            masters = self.masters()
        return masters[turn % len(masters)]

    def masters(self) -> list[Address]:
        return [a for a in dict.fromkeys(self._slots) if a is not None]

    def eval(
        self, call: ScriptCall, deliver: OnReply, hops: int = 0, asking: Address | None = None
    ) -> None:
        answered = functools.partial(self._answered, call, deliver, hops)
        if asking is not None:  # (the answer to ASKING is ignored)
            data = pack(b"ASKING") + call.data
            self.link_to(asking).send(data, [lambda _: None, answered], [None, call])
            return
        address = self._slots[key_slot(call.keys[0])]
        if address is None:
            self.reset()
            deliver(NodeConnectionError(f"no master known for slot {key_slot(call.keys[0])} (yet)"))
            return
        self.link_to(address).eval(call, answered)

    def _answered(self, call: ScriptCall, deliver: OnReply, hops: int, reply: Any) -> None:
        if type(reply) is ReplyError:
            text = str(reply)
            if text.startswith(("MOVED ", "ASK ")) and hops < 5:
                kind, slot, where = text.split()
                host, _, port = where.rpartition(":")
                known = self._slots[int(slot)] or self._seeds[0]
                address = Address(host or known.host, int(port), tls=self._tls)  # (":port")
                if kind == "MOVED":
                    self._slots[int(slot)] = address
                    self.reset()
                    self.eval(call, deliver, hops + 1)
                else:
                    self.eval(call, deliver, hops + 1, address)
                return
            if text.startswith("CLUSTERDOWN"):
                self.reset()
        elif isinstance(reply, BaseException):
            self.reset()  # (a node that fails or does not answer: failed over, maybe)
        deliver(reply)

    def eval_many(self, calls: Sequence[ScriptCall], deliver: OnReply) -> None:
        collect = collector(len(calls), deliver)
        groups: dict[Address | None, list[int]] = {}
        for index, call in enumerate(calls):
            groups.setdefault(self._slots[key_slot(call.keys[0])], []).append(index)
        for address, indexes in groups.items():
            if address is None:
                for index in indexes:
                    self.eval(calls[index], collect[index])
                continue
            callbacks: list[OnReply] = [
                functools.partial(self._answered, calls[i], collect[i], 0) for i in indexes
            ]
            data = b"".join(calls[i].data for i in indexes)
            self.link_to(address).send(data, callbacks, [calls[i] for i in indexes])

    def eval_wait(self, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
        address = self._slots[key_slot(call.keys[0])]
        if address is None:
            self.eval(call, deliver)  # (answers: no master known)
            return
        link = self.link_to(address, "redis (WAIT)")

        def done(result: Any) -> None:
            first = result[0] if isinstance(result, list) else None
            if type(first) is ReplyError and str(first).startswith(("MOVED ", "ASK ")):
                # The slot moved: the script runs where it went; the WAIT asked the wrong
                # master, so nothing is acknowledged.
                self._answered(
                    call, lambda r: deliver(r if isinstance(r, Exception) else [r, 0]), 0, first
                )
                return
            if isinstance(result, BaseException):
                self.reset()
            deliver(result)

        link.eval_wait(call, wait, done)

    async def ping(self) -> None:
        await self.refresh()
        masters = self.masters()
        replies = await asyncio.gather(*(self.link_to(a).call(pack(b"PING")) for a in masters))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply

    def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        for link in self._links.values():
            link.close()


class ServerLinks:
    """Where a deployment's commands go (each method sends at once), on one server (plain,
    Unix socket, TLS, or the master a Sentinel names): ONE link for every command, and one
    more, made on first use, for grants that ``WAIT`` (it blocks its connection).  It closes
    the ``sentinels``' links, too."""

    def __init__(
        self, link: Link, make_wait_link: Callable[[], Link], sentinels: Sequence[Link] = ()
    ) -> None:
        self.link = link
        self._make_wait_link = make_wait_link
        self._wait_link: Link | None = None
        #: (in the order they are asked: the one that answered last first)
        self.sentinels = sentinels
        # NOTE: the link's own methods, not wrappers: the hot path pays no extra call.
        self.eval = link.eval
        self.eval_many = link.eval_many

    def eval_wait(self, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
        if self._wait_link is None:
            self._wait_link = self._make_wait_link()
        self._wait_link.eval_wait(call, wait, deliver)

    async def ping(self) -> None:
        reply = await self.link.call(pack(b"PING"))
        if isinstance(reply, BaseException):
            raise reply

    def reset(self) -> None:
        for link in (self.link, self._wait_link):
            if link is not None and (link.pipe is None or link.pipe.oldest() is None):  # idle
                link.drop(ConnectionError("the server may have changed"))

    def close(self) -> None:
        for link in (self.link, self._wait_link, *self.sentinels):
            if link is not None:
                link.close()


#: Where a deployment's commands go.
Links: TypeAlias = ServerLinks | ClusterLinks


def connect_deployment(s: Settings, config: CommonConfig) -> tuple[Links, Link]:
    """The command links of the deployment and the link for its pub/sub connection."""
    tls = ssl_context_factory(s.ssl) if s.tls else None
    own = hello(s.username, s.password, s.db, s.client_name)  # (the pub/sub connections')
    scripts = [*own, *hello(scripts=ALL_SCRIPTS)]

    def make_link(target: Target, label: str = "redis", auth: Sequence[bytes] = scripts) -> Link:
        return Link(label, target, config, hello=auth)

    if s.mode == "cluster":
        cluster = ClusterLinks([Address(h, p, tls=tls) for h, p in s.hosts], make_link)
        return cluster, make_link(cluster.next_master, auth=own)
    target: Target
    sentinels: list[Link] = []
    if s.mode == "sentinel":
        assert s.service_name is not None
        service, auth = s.service_name, hello(s.sentinel_username, s.sentinel_password)
        sentinels = [
            make_link(Address(h, p, tls=tls), f"redis sentinel {h}:{p}", auth) for h, p in s.hosts
        ]

        # (each sentinel gets its share of a connection's time: one that stopped answering
        # must not use it all before the next is asked)
        each = min(config.op_timeout, config.connect_timeout / len(sentinels))
        ask = pack(b"SENTINEL", b"get-master-addr-by-name", service)

        async def master() -> Address:
            """Where the master a Sentinel names listens: asked again for every new
            connection, so a link follows a failover when it reconnects.  The sentinels are
            asked in turn; the one that answered is asked first the next time."""
            failures = []
            for link in list(sentinels):
                try:
                    async with asyncio.timeout(each):
                        reply = await link.call(ask)
                except TimeoutError:
                    reply = f"no answer within {each:g} s"
                if isinstance(reply, list) and len(reply) == 2:
                    if link is not sentinels[0]:
                        sentinels.remove(link)
                        sentinels.insert(0, link)
                    return Address(reply[0].decode(), int(reply[1]), tls=tls)
                failures.append(f"{link.label}: {reply if reply is not None else 'unknown master'}")
            raise NodeConnectionError(
                f"no sentinel names the master of {service!r}: {'; '.join(failures)}"
            )

        target = master
    elif s.mode == "unix":
        assert s.socket_path is not None
        target = Address(path=s.socket_path)
    else:
        host, port = s.hosts[0]
        target = Address(host, port, tls=tls)
    wait_link = functools.partial(make_link, target, "redis (WAIT)")
    return ServerLinks(make_link(target), wait_link, sentinels), make_link(target, auth=own)


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
