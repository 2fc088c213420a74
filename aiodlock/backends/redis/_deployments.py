"""How the Redis backends reach their servers (given their :mod:`._settings`): one server,
a Unix socket, TLS, the master a Sentinel names, Cluster (the slot map, one link per master,
redirections)."""

from __future__ import annotations

import asyncio
import binascii
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias

from ..._types import CommonConfig, monotonic
from ._scripts import ALL_SCRIPTS
from ._settings import Settings, ssl_context_factory
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
