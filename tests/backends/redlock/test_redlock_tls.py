"""Redlock over TLS: every node's pipelined connection and pub/sub connection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import aiodlock
from tests.helpers import make_tls_certs, tls_server_args
from tests.servers import free_port

from .redlock_helpers import HANG, backend_of, eventually, port_of

pytestmark = pytest.mark.redis


async def test_tls_to_every_node(redis_factory: Any, tmp_path: Path) -> None:
    ca, cert, key = make_tls_certs(tmp_path)
    ports = []
    servers = []
    for _ in range(3):
        port = free_port()
        servers.append(redis_factory(extra_args=tls_server_args(port, ca, cert, key)))
        ports.append(port)
    url = "redlock://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    a = aiodlock.connect(url, ssl=True, ssl_ca_certs=str(ca))
    b = aiodlock.connect(f"{url}?ssl=true&ssl_ca_certs={ca}")
    async with a, b:
        links = [node.link for node in backend_of(a).nodes]
        await eventually(lambda: all(link.pipe is not None for link in links), what="connected")
        ports = [port_of(link) for link in links]
        lock = a.lock("tls")
        first = await lock.acquire()
        # every link still on the connection it made first (over TLS), as the servers see it
        assert [port_of(link) for link in links] == ports
        for port, server in zip(ports, servers, strict=True):
            assert f":{port} " in server.cli("CLIENT", "LIST")

        async def wait_for_it() -> int:
            async with b.lock("tls", timeout=HANG) as lease:
                return lease.token

        waiting = asyncio.create_task(wait_for_it())
        await eventually(
            lambda: all(node.hub.channels() for node in backend_of(b).nodes), what="subscribed"
        )
        await lock.release()
        token = await asyncio.wait_for(waiting, HANG)  # woken over TLS pub/sub
        assert token > first.token
    # Without our CA the nodes cannot be verified: no majority, a clear error.
    untrusted = aiodlock.connect(url, ssl=True, connect_timeout=2, op_timeout=2)
    with pytest.raises(aiodlock.BackendError) as info:
        await untrusted.open()
    assert "certificate" in str(info.value).lower()
    # And without TLS at all, a TLS port does not answer the protocol.
    plain = aiodlock.connect(url, connect_timeout=1, op_timeout=1)
    with pytest.raises(aiodlock.BackendError):
        await plain.open()
