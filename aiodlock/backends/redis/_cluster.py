"""Redis Cluster over pipelined links: the slot map, one link per master, redirections."""

from __future__ import annotations

import asyncio
import binascii
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..._types import monotonic
from ._wire import (
    Address,
    Link,
    NodeConnectionError,
    OnReply,
    ReplyError,
    ScriptCall,
    collector,
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


class SlotUncovered(ConnectionError):
    """No master is known for a slot (yet): the slot map is being read again."""


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

    def eval(self, call: ScriptCall, deliver: OnReply) -> None:
        self._send(call, deliver, 0, None)

    def _send(self, call: ScriptCall, deliver: OnReply, hops: int, asking: Address | None) -> None:
        answered = functools.partial(self._answered, call, deliver, hops)
        if asking is not None:
            data = pack(b"ASKING") + call.data
            self.link_to(asking).send(data, [_ignore, answered], [None, call])
            return
        address = self._slots[key_slot(call.keys[0])]
        if address is None:
            self.reset()
            deliver(SlotUncovered(f"no master known for slot {key_slot(call.keys[0])} (yet)"))
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
                    self._send(call, deliver, hops + 1, None)
                else:
                    self._send(call, deliver, hops + 1, address)
                return
            if text.startswith("CLUSTERDOWN"):
                self.reset()
        elif isinstance(reply, BaseException):
            self.reset()  # (a node that fails or does not answer: failed over, maybe)
        deliver(reply)

    def eval_many(self, calls: Sequence[ScriptCall], deliver: OnReply) -> None:
        if not calls:
            deliver([])
            return
        collect = collector(len(calls), deliver)
        groups: dict[Address | None, list[int]] = {}
        for index, call in enumerate(calls):
            groups.setdefault(self._slots[key_slot(call.keys[0])], []).append(index)
        for address, indexes in groups.items():
            if address is None:
                for index in indexes:
                    self._send(calls[index], collect[index], 0, None)
                continue
            callbacks: list[OnReply] = [
                functools.partial(self._answered, calls[i], collect[i], 0) for i in indexes
            ]
            data = b"".join(calls[i].data for i in indexes)
            self.link_to(address).send(data, callbacks, [calls[i] for i in indexes])

    def eval_wait(self, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
        address = self._slots[key_slot(call.keys[0])]
        if address is None:
            self._send(call, deliver, 0, None)  # (answers SlotUncovered)
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


def _ignore(reply: Any) -> None:
    pass  # (the answer to ASKING)
