"""etcds:// (TLS) and user/password authentication against private members."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

import aiodlock
from tests.helpers import ClientFactory, make_tls_certs
from tests.servers import EtcdServer

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


class TLSEtcdServer(EtcdServer):
    """A member whose client URL is https (its certificate from make_tls_certs)."""

    def __init__(self, base_dir: Path, ca: Path, cert: Path, key: Path) -> None:
        super().__init__(base_dir, extra_args=["--cert-file", str(cert), "--key-file", str(key)])
        self.ca = ca

    @property
    def client_url(self) -> str:
        return f"https://{self.address}"

    def ping(self, timeout: float = 0.5) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=timeout, context=context
            ) as reply:
                return json.loads(reply.read()).get("health") in (True, "true")
        except (OSError, ValueError):
            return False


async def test_tls_with_the_servers_ca(
    tmp_path: Path, namespace: str, make_client: ClientFactory
) -> None:
    ca, cert, key = make_tls_certs(tmp_path)
    server = TLSEtcdServer(tmp_path, ca, cert, key).start()
    try:
        for host in ("127.0.0.1", "localhost"):
            url = f"etcds://{host}:{server.port}?ssl_ca_certs={ca}"
            client = await make_client(url)
            async with client.lock("tls") as lease:
                assert lease.token > 0
        plain = aiodlock.connect(f"etcd://127.0.0.1:{server.port}", connect_timeout=1.0)
        with pytest.raises(aiodlock.BackendError):
            await plain.open()
    finally:
        server.close()


async def test_user_and_password(
    etcd_factory: Callable[..., EtcdServer], namespace: str, make_client: ClientFactory
) -> None:
    server = etcd_factory()
    server.cli("user", "add", "root:r00tpw")
    server.cli("auth", "enable")
    client = await make_client(f"etcd://root:r00tpw@{server.address}", watchdog_ttl=1)
    other = await make_client(f"etcd://{server.address}", username="root", password="r00tpw")
    async with client.lock("auth") as lease:
        status = await other.status("auth")
        assert status is not None
        assert status.owner == lease.owner
        await asyncio.sleep(2.5)  # past the lease's TTL: the keep-alives carry the token
        assert not lease.lost
    wrong = aiodlock.connect(f"etcd://root:wrongpw@{server.address}", connect_timeout=2.0)
    with pytest.raises(aiodlock.BackendError) as caught:
        await wrong.open()
    assert "wrongpw" not in str(caught.value)
    # (etcd grants a lease without a user: the first request on a key is refused)
    anonymous = await make_client(f"etcd://{server.address}")
    with pytest.raises(aiodlock.BackendError):
        await anonymous.lock("auth").acquire(timeout=1.0)
