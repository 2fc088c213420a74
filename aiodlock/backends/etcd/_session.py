"""The client's connection and its ONE lease (etcd's concurrency Session), kept alive by a
loop of our own with a deadline: etcd3aio's ``keep_alive_context`` only logs a failure and
never says that the lease is gone, so the loss of a lease would go unnoticed.

The lease is granted with ``watchdog_ttl`` (whole seconds, at least one) and refreshed every
third of its TTL.  When no keep-alive is answered before the TTL has run out since the last
answered one was SENT, or the server answers that the lease is gone (revoked, expired), the
lease is lost: ``on_lost(lease, reason)`` is called once, and the next acquisition grants a
fresh lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from etcd3aio import (
    Etcd3Client,
    EtcdConnectionError,
    EtcdError,
    EtcdTransientError,
    TokenRefresher,
)
from etcd3aio.connections import ConnectionManager

from ..._errors import BackendError, BackendTimeout, ConfigurationError, translating
from ..._types import CommonConfig, monotonic
from ..._wakeup import Heartbeat
from ._kv import KV

log = logging.getLogger("aiodlock.etcd")

#: A failed keep-alive is tried again after this share of the TTL (and at most 0.5 s).
RETRY_SHARE = 0.1
#: A lease's token is authenticated again this often (etcd's simple tokens last 300 s).
TOKEN_REFRESH = 120.0


def translate(what: str, secrets: tuple[str, ...] = ()) -> contextlib.AbstractContextManager[None]:
    """THE translation of etcd3aio's and grpc's errors: UNAVAILABLE is transient and
    DEADLINE_EXCEEDED a timeout, whether etcd3aio or a call of our own (:mod:`._kv`) met it."""
    return _Translated(what, secrets)


class _Translated:
    """(a class, not a generator: it is entered twice per lock cycle)"""

    __slots__ = ("secrets", "what")

    def __init__(self, what: str, secrets: tuple[str, ...]) -> None:
        self.what = what
        self.secrets = secrets

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise BackendTimeout(f"etcd: {self.what} timed out") from exc
        try:
            with translating(
                "etcd",
                (EtcdError, grpc.aio.AioRpcError),
                (EtcdTransientError,),
                what=self.what,
                secrets=self.secrets,
                transient=(EtcdConnectionError,),
            ):
                raise exc
        except BackendError as error:
            if code == grpc.StatusCode.UNAVAILABLE:
                error.transient = True
            raise


def rpc_code(error: BaseException) -> Any:
    """The gRPC status code behind a translated error (None when it had none)."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    while cause is not None and not isinstance(cause, grpc.aio.AioRpcError):
        cause = cause.__cause__
    return cause.code() if cause is not None else None


LeaseLost = Callable[[int, str], None]


class Session:
    """One Etcd3Client (leases, watches, authentication), a channel of our own for the
    transactions (:mod:`._kv`), and the lease every lock key of the client is attached to."""

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        config: CommonConfig,
        *,
        tls: dict[str, bytes | None] | None,
        credentials: tuple[str, str] | None,
        on_lost: LeaseLost,
        on_back: Callable[[], None],
    ) -> None:
        self.hosts = hosts
        self.config = config
        self.ttl = max(1, math.ceil(config.watchdog_ttl))
        self._tls = tls
        self._credentials = credentials
        self._secrets = (credentials[1],) if credentials else ()
        self._on_lost = on_lost
        self._on_back = on_back
        self.client: Etcd3Client | None = None
        self._kv: KV | None = None
        self._refresher: TokenRefresher | None = None
        #: The lease in force (0: none yet, or the last one was lost) and its grant on its way.
        self.lease = 0
        self._granting: asyncio.Task[int] | None = None
        self._keeper: Heartbeat | None = None
        self.closed = False

    def translate(self, what: str) -> contextlib.AbstractContextManager[None]:
        return translate(what, self._secrets)

    async def start(self) -> None:
        endpoints = [await _resolve(host, port) for host, port in self.hosts]
        options: dict[str, Any] = {"rpc_max_attempts": 1}  # the core owns the retries
        if self._tls is not None:
            names = [h for h, _ in self.hosts if not _is_ip(h)]
            options.update(self._tls, tls_server_name=names[0] if names else None)
        self.client = client = Etcd3Client(endpoints, **options)
        tls = self._tls or {}
        tls_name = options.get("tls_server_name")
        manager = ConnectionManager(endpoints)
        # gRPC's own retries off on this channel (etcd3aio turns them on): their per-call
        # state cost about 15 us of a ~340 us transaction, and the core owns the retries.
        manager.grpc_options = [
            *(o for o in manager.grpc_options if o[0] != "grpc.enable_retries"),
            ("grpc.enable_retries", 0),
        ]
        channel = manager.get_channel(**tls, tls_server_name=tls_name)
        self._kv = KV(channel)
        with self.translate("connect"):
            await client.connect()
            async with asyncio.timeout(self.config.connect_timeout):
                if self._credentials is not None:
                    user, password = self._credentials
                    assert client.auth is not None
                    refresher = TokenRefresher(
                        client.auth, self._set_token, user, password, interval=TOKEN_REFRESH
                    )
                    await refresher.__aenter__()
                    self._refresher = refresher
                await self.current()

    def _set_token(self, token: str | None) -> None:
        """The authentication token, for etcd3aio's calls and ours."""
        if self.client is not None:
            self.client.set_token(token)
        if self._kv is not None:
            self._kv.set_token(token)

    async def close(self) -> None:
        """Revoke the lease (its keys go at once) and disconnect."""
        self.closed = True
        if self._keeper is not None:
            await self._keeper.aclose()
        if self._granting is not None:
            self._granting.cancel()
            with contextlib.suppress(BaseException):
                await self._granting
        lease, self.lease = self.lease, 0
        kv, self._kv = self._kv, None
        client, self.client = self.client, None
        if kv is not None:
            with contextlib.suppress(Exception):
                await kv.channel.close()
        if client is None:
            return
        if lease and client.lease is not None:
            # (a task of its own: grpc ends a call past its deadline as "cancelled", which
            # must not look like the cancellation of close())
            revoke = asyncio.ensure_future(
                client.lease.revoke(lease, timeout=self.config.op_timeout)
            )
            revoke.add_done_callback(_ignore)
            try:
                await asyncio.wait([revoke], timeout=self.config.op_timeout * 2)
            finally:
                revoke.cancel()
        if self._refresher is not None:
            with contextlib.suppress(Exception):
                await self._refresher.__aexit__(None, None, None)
            self._refresher = None
        with contextlib.suppress(Exception):
            await client.close()

    @property
    def io(self) -> Etcd3Client:
        if self.client is None or self.closed:
            raise BackendError("etcd: the client is not open (or was closed)")
        return self.client

    @property
    def kv(self) -> KV:
        """The transactions' channel."""
        if self._kv is None or self.closed:
            raise BackendError("etcd: the client is not open (or was closed)")
        return self._kv

    async def current(self) -> int:
        """The lease in force, granted first when there is none (one grant at a time)."""
        if self.lease:
            return self.lease
        if self._granting is None:
            self._granting = asyncio.get_running_loop().create_task(self._grant())
        granting = self._granting
        try:
            return await asyncio.shield(granting)
        finally:
            if granting.done() and self._granting is granting:
                self._granting = None

    async def _grant(self) -> int:
        lease = self.io.lease
        assert lease is not None
        sent = monotonic()
        with self.translate("grant a lease"):
            reply = await lease.grant(self.ttl, timeout=self.config.op_timeout)
        self.lease = reply.ID
        self._keeper = self._keep_alive(reply.ID, sent + reply.TTL)
        return int(reply.ID)

    def _keep_alive(self, lease_id: int, deadline: float) -> Heartbeat:
        """Refresh the lease every third of its TTL; lose it when the deadline passes."""
        failing = False

        def until(due: float) -> float:
            return max(0.0, min(due, deadline) - monotonic())

        async def beat() -> float | None:
            nonlocal deadline, failing
            sent = monotonic()
            if sent >= deadline:
                self.lose(lease_id, f"no keep-alive of the lease answered within {self.ttl} s")
                return None
            try:
                async with asyncio.timeout(min(self.config.op_timeout, deadline - sent)):
                    ttl = await self._refresh(lease_id)
            except (TimeoutError, EtcdError, grpc.aio.AioRpcError, OSError) as exc:
                log.debug("etcd: keep-alive of lease %x failed: %r", lease_id, exc)
                failing = True
                return until(monotonic() + min(self.ttl * RETRY_SHARE, 0.5))
            if failing:
                failing = False
                self._on_back()  # (the clean-ups left to the background can go on now)
            if ttl <= 0:
                self.lose(lease_id, "the lease was revoked or had expired on the server")
                return None
            deadline = sent + ttl
            return until(sent + ttl / 3)

        keeper = Heartbeat(beat, f"aiodlock:etcd-lease-{lease_id:x}")
        keeper.start(until(monotonic() + self.ttl / 3))
        return keeper

    async def _refresh(self, lease_id: int) -> int:
        """One keep-alive round trip: the TTL the server gave the lease (<= 0: it is gone)."""
        lease = self.io.lease
        assert lease is not None
        stream = lease.keep_alive(lease_id)
        try:
            async for reply in stream:
                return int(reply.TTL)
        finally:
            stream.cancel()
        raise EtcdConnectionError("the keep-alive stream ended without an answer")

    def lose(self, lease_id: int, reason: str) -> None:
        """The lease ``lease_id`` is gone: report it once (a later lease is not touched)."""
        if self.lease != lease_id:
            return
        self.lease = 0
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
        log.warning("etcd: lease %x lost: %s", lease_id, reason)
        self._on_lost(lease_id, reason)

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lost lease (so that its keys go now if the server still has it)."""
        lease = self.io.lease
        assert lease is not None
        try:
            with self.translate("revoke a lease"):
                await lease.revoke(lease_id, timeout=self.config.op_timeout)
        except BackendError as error:
            if rpc_code(error) != grpc.StatusCode.NOT_FOUND:
                raise


def _ignore(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET, host)
    except OSError:
        return False
    return True


async def _resolve(host: str, port: int) -> str:
    """``ip:port``: etcd3aio makes one ``ipv4:`` gRPC target of its endpoints, which takes
    addresses only (it turns ``localhost`` into ``127.0.0.1`` and nothing else)."""
    if _is_ip(host):
        return f"{host}:{port}"
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except OSError as exc:
        error = BackendError(f"etcd: cannot resolve the host {host!r}: {exc}")
        error.transient = True
        raise error from exc
    return f"{infos[0][4][0]}:{port}"


def tls_options(files: dict[str, str | None]) -> dict[str, bytes | None]:
    """etcd3aio's TLS arguments from the ``ssl_*`` file options (the system's CAs by default)."""
    ca = files["ssl_ca_certs"] or ssl.get_default_verify_paths().cafile
    if not ca:
        raise ConfigurationError("etcds:// needs ssl_ca_certs (no system CA bundle was found)")
    if bool(files["ssl_certfile"]) != bool(files["ssl_keyfile"]):
        raise ConfigurationError("ssl_certfile and ssl_keyfile go together (client certificate)")

    def read(name: str, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"option {name!r}: cannot read {path!r}: {exc}") from exc

    return {
        "ca_cert": read("ssl_ca_certs", ca),
        "cert_chain": read("ssl_certfile", files["ssl_certfile"]),
        "cert_key": read("ssl_keyfile", files["ssl_keyfile"]),
    }
