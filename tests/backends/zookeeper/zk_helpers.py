"""Helpers shared by the ZooKeeper backend tests."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

import aiozk
from aiozk import exc

import aiodlock
from aiodlock.backends.zookeeper import ZooKeeperBackend
from tests.helpers import HANG as HANG
from tests.helpers import ClientFactory as ClientFactory
from tests.helpers import eventually as eventually
from tests.servers import ZooKeeperServer

RawFactory = Callable[[str], Awaitable[aiozk.ZKClient]]


def backend_of(client: aiodlock.Client) -> ZooKeeperBackend:
    backend = client.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


async def children(raw: aiozk.ZKClient, path: str) -> list[str]:
    """The children of ``path`` ([] when it does not exist)."""
    try:
        names: list[str] = await raw.get_children(path)
    except exc.NoNode:
        return []
    return names


async def queue_length(client: aiodlock.Client, raw: aiozk.ZKClient, name: str) -> int:
    return len(await children(raw, backend_of(client).lock_path(name)))


def options_query(**options: Any) -> str:
    return "&".join(f"{k}={v}" for k, v in options.items())


@dataclass(frozen=True)
class ServerRequest:
    """One request as the server logged it: its session, type and path (reads only)."""

    session: int
    kind: str  # ZooKeeper's name of the opcode: create2, getChildren, getData, exists ...
    path: str | None


_PROCESSING = re.compile(
    r"Processing request:: sessionid:0x([0-9a-f]+) type:(\S+) .* reqpath:(\S+)"
)


class RequestLogZooKeeper(ZooKeeperServer):
    """A standalone server that logs every request it processes (FinalRequestProcessor at
    DEBUG): the server's own record of what each session sent, in order."""

    def _command(self) -> list[str]:
        command = super()._command()
        command.insert(
            1,
            "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.FinalRequestProcessor=debug",
        )
        return command

    def requests(self, sessions: Collection[int] | None = None) -> list[ServerRequest]:
        """Every request processed so far (of ``sessions`` only, when given), in order."""
        found = []
        for line in self.console_path.read_text(errors="replace").splitlines():
            match = _PROCESSING.search(line)
            if match is None:
                continue
            session = int(match[1], 16)
            if sessions is None or session in sessions:
                path = None if match[3] == "n/a" else match[3]
                found.append(ServerRequest(session, match[2], path))
        return found

    def watch_notifications(self) -> int:
        """How many watchers the server has notified of deleted nodes (mntr)."""
        for line in self.four_letter("mntr").splitlines():
            key, _, value = line.partition("\t")
            if key == "zk_sum_node_deleted_watch_count":
                return int(value)
        raise AssertionError("mntr has no zk_sum_node_deleted_watch_count")
