"""``redlock://h1:6379,h2:6379,h3:6379``: Redlock over N independent Redis masters.

Each master keeps the data and runs the scripts of a plain ``redis://`` lock.  An attempt
asks every node at once (each answer awaited at most ``node_timeout``): the lock is held
when a majority said yes within the ttl, valid until ``start + ttl - drift``; otherwise it
is undone on every node that did not say no, and a split vote pauses the owner for a random
time of at most ``retry_delay``.  The fencing token is the largest of the granting nodes'
counters (the lagging ones are raised to it on a majority first).  See
``docs/backends/redlock.md`` for the guarantees and, above all, what is not safe.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Self

from ..._errors import BackendError, describe
from ..._types import Busy, Capability, Grant, LockStatus, Request, monotonic
from ..._wakeup import Backoff, WakeupBoard
from ._pubsub import Listening, PubSubHub
from ._quorum import Gather, Node, Outcome, Quorum, Votes, answered
from ._scripts import RAISE_COUNTER, REDLOCK_SCRIPTS, REJOIN, RENEW, LockKeys
from ._settings import RedlockSettings, parse_redlock_settings, ssl_context_factory
from ._wire import Address, Link, OnReply, ScriptCall, hello, pack
from .backend import KeyedBackend, ms

if TYPE_CHECKING:
    from ..._types import CommonConfig, LostCallback
    from ..._url import ParsedURL

__all__ = ["RedlockBackend"]

log = logging.getLogger("aiodlock")

#: ``node_timeout`` when not given: ``min(50 ms, ttl / 100)`` but at least this.
MIN_NODE_TIMEOUT: Final = 0.01
MAX_AUTO_NODE_TIMEOUT: Final = 0.05
#: The longest pause after a split vote of a waiter in line (urgent).
SPLIT_IN_LINE: Final = 0.005
#: Added to ``ttl * drift_factor`` (the Redlock paper's 2 ms for the timer resolution).
DRIFT_FLOOR: Final = 0.002


@dataclasses.dataclass(slots=True)
class GrantData:
    keys: LockKeys
    #: node index -> the token that node granted: the acquire's ballot's, which a node that
    #: grants after the vote still joins (its release and renewals then send that token)
    tokens: dict[int, int]
    token: int  # the lease's token (the largest of them)


class RedlockBackend(KeyedBackend[RedlockSettings]):
    """Redlock: a lock is held when a majority of N independent Redis masters granted it."""

    backend_name = "redlock"
    # NOTE: FENCING holds only under the conditions the docs list (no counter lost).
    capabilities = (
        Capability.FENCING | Capability.CROSS_PROCESS | Capability.LOCAL_TURNS | Capability.URGENT
    )
    ranks_by_client = True

    def __init__(self, settings: RedlockSettings, config: CommonConfig) -> None:
        super().__init__(settings, config)
        self.quorum = len(settings.hosts) // 2 + 1
        self._nodes: list[Node] = []
        #: Per node, from when its votes count; None while every node counts (rejoin_delay)
        self._after: list[float] | None = None
        #: The local waiters by channel, woken by every node's hub (one at a time).
        self.board = WakeupBoard(single=True)
        #: The rejoin marker (see REJOIN), one per namespace and node.
        self.marker = config.namespace.encode() + b":redlock:rejoin"
        self.secrets = tuple(p for p in (settings.password, *(settings.passwords or ())) if p)
        self._patience = self.node_timeout(config.watchdog_ttl)
        self.fan = Quorum(self.quorum, self.secrets)

    @classmethod
    def from_url(cls, url: ParsedURL, config: CommonConfig, options: dict[str, Any]) -> Self:
        return cls(parse_redlock_settings(url, config, options), config)

    def describe(self) -> str:
        return self.settings.shown

    def node_timeout(self, ttl: float) -> float:
        """How long an acquire waits for one node's answer, for a lease of ``ttl`` seconds."""
        if self.settings.node_timeout is not None:
            return self.settings.node_timeout
        return max(MIN_NODE_TIMEOUT, min(MAX_AUTO_NODE_TIMEOUT, ttl / 100))

    def drift(self, ttl: float) -> float:
        """Clock drift allowance subtracted from a lease's validity."""
        return ttl * self.settings.drift_factor + DRIFT_FLOOR

    @property
    def nodes(self) -> list[Node]:
        """The nodes (after :meth:`open`), in URL order."""
        if not self._nodes:
            raise BackendError("redlock: the backend is not open")
        return self._nodes

    def _build_node(self, index: int, host: str, port: int) -> Node:
        s = self.settings
        auth = hello(s.username, s.password if s.passwords is None else s.passwords[index], s.db)
        address = Address(host, port, tls=ssl_context_factory(s.ssl) if s.tls else None)
        node = Node(index, str(address), self.secrets)
        link = functools.partial(Link, node.label, address, self.config)
        # (with rejoin_delay, every new connection asks the REJOIN script when it counts)
        rejoin = [pack(b"EVAL", REJOIN.source, 1, self.marker, ms(s.rejoin_delay))]
        node.link = link(
            hello=[*auth, *hello(scripts=REDLOCK_SCRIPTS), *(rejoin if s.rejoin_delay else ())],
            on_hello=functools.partial(self._rejoined, node) if s.rejoin_delay else None,
        )
        node.hub = PubSubHub(link(hello=auth), self.board, self.config, node.label, self.secrets)
        return node

    def _rejoined(self, node: Node, replies: list[Any]) -> None:
        """The REJOIN script's answer: from when ``node``'s votes count."""
        left = replies[-1] if isinstance(replies[-1], int) else 0
        node.counts_after = monotonic() + max(0, left) / 1000
        delayed = [n.counts_after for n in self._nodes]
        self._after = delayed if max(delayed) > -math.inf else None
        if left > 0:
            log.warning(
                "aiodlock: %s has lost its data (restarted without persistence?); its "
                "votes count again in %.1f s (rejoin_delay)",
                node.label,
                left / 1000,
            )

    async def open(self, on_lost: LostCallback) -> None:
        self._after = None
        self._nodes = [
            self._build_node(i, host, port) for i, (host, port) in enumerate(self.settings.hosts)
        ]
        # (a majority is enough; the others go on connecting)
        ping = pack(b"PING")
        outcomes = await self._majority(
            lambda node, deliver: node.link.send(ping, [deliver]),
            "connect",
            self.config.connect_timeout * 0.9,
        )
        for node, outcome in zip(self._nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                reason = describe(outcome, self.secrets)
                log.warning("aiodlock: %s is not answering (yet): %s", node.label, reason)

    async def _majority(
        self, request: ScriptCall | Callable[[Node, OnReply], None], what: str, timeout: float
    ) -> list[Outcome]:
        """Ask every node; a majority must answer (it is not waited for the others)."""
        outcomes = await self.fan(
            self._nodes,
            request,
            what=what,
            timeout=timeout,
            patience=self._patience,
            decided=lambda replies: answered(replies) >= self.quorum,
        )
        count = answered(outcomes)
        if count < self.quorum:
            raise BackendError(
                f"redlock: {what}: only {count} of {len(self._nodes)} nodes answered, a "
                f"majority ({self.quorum}) is needed: {self.fan.errors(outcomes)}"
            )
        return outcomes

    async def aclose(self) -> None:
        nodes, self._nodes = self._nodes, []
        for node in nodes:
            node.link.close()
        for node in nodes:
            await node.hub.aclose()

    async def try_acquire(self, request: Request, *, will_wait: bool) -> Grant | Busy:
        keys, nodes, quorum = self.keys_for(request.name), self.nodes, self.quorum
        owner, ttl = request.owner, request.ttl
        timeout = self.node_timeout(ttl)
        started = monotonic()
        ballot = Votes(len(nodes), quorum, acquire=True, after=self._after)
        # NOTE: a majority of yes is enough: the other nodes' answers still come (in order
        # on their connections, before any later request of ours there).
        self.fan.start(nodes, self.acquire_call(keys, request, will_wait), ballot)
        in_line = request.urgent and will_wait
        await self.fan.finish(ballot, timeout=timeout, patience=0.0)
        drift = self.drift(ttl)
        tokens = ballot.tokens
        assert tokens is not None  # (an acquire's)
        if ballot.yes >= quorum and monotonic() - started + drift < ttl:
            token = max(tokens.values())
            level = min(tokens.values()) == token or await self._raise_counters(
                keys, tokens, token, timeout
            )
            if level and monotonic() - started + drift < ttl:
                if in_line:
                    self._leave_line(keys, owner, tokens)
                data = GrantData(keys, tokens, token)
                return Grant(request.name, owner, token, started + ttl - drift, data)
        outcomes = self.fan.outcomes(nodes, ballot.replies, "acquire", timeout)
        busy_pttls: list[int] = []
        busy_nodes: set[int] = set()
        failed = broken = 0
        for node, outcome in zip(nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed += 1
                if not isinstance(outcome, TimeoutError):
                    broken += 1
            elif outcome < 1:  # (-1 - ms left on the holder's lease, or 0: no expiry)
                busy_nodes.add(node.index)
                busy_pttls.append(-1 - outcome)
        # Not held: undo it wherever it may have been set (every node that did not say no).
        # NOTE: on each node the undo runs after the attempt (same connection, in order),
        # even where the attempt's answer is still on its way.
        undo = [node for node in nodes if node.index not in busy_nodes]
        if undo:
            # (an urgent waiter keeps its places in line: its rank, the same on every node,
            # wins the next vote unless an older waiter's does)
            await self._undo(keys, owner, undo, "hold" if in_line else "")
        if broken > len(nodes) - quorum:
            # NOTE: only failures that a second attempt at once will not cure (refused
            # connections, errors): timeouts are retried, as a stall of this process makes
            # every node "time out".
            error = BackendError(
                f"redlock: {broken} of {len(nodes)} nodes failed on {request.name!r}, so no "
                f"majority ({quorum}) is possible: {self.fan.errors(outcomes)}"
            )
            # Nodes that cannot be reached (restarting, say) may come back: a waiting
            # acquire then tries again for a while (the core bounds it, see _waiting).
            error.transient = all(
                isinstance(o, BackendError) and o.transient
                for o in outcomes
                if isinstance(o, BaseException) and not isinstance(o, TimeoutError)
            )
            raise error
        if len(busy_nodes) >= quorum:
            # Held by someone: wake when enough of the holder's keys would have expired.
            pttls = sorted(p for p in busy_pttls if p >= 0)
            needed = max(1, quorum - (len(nodes) - len(busy_nodes) - failed))
            return Busy(pttls[needed - 1] / 1000 if len(pttls) >= needed else None)
        # A split vote (or nodes not counted yet): try again after a random pause (short for
        # a waiter in line: every node ranks the line alike, the first in line wins next).
        pause = self.settings.retry_delay
        return Busy(random.uniform(0.0, min(pause, SPLIT_IN_LINE) if in_line else pause), True)

    async def _raise_counters(
        self, keys: LockKeys, tokens: dict[int, int], token: int, timeout: float
    ) -> bool:
        """Raise the lagging counters of the granting nodes to ``token``: True when a majority
        of counted nodes is then at ``token`` or above, so every later grant (whose majority
        shares a node with this one) gets a larger token."""
        nodes = self.nodes
        lagging = [nodes[i] for i, t in tokens.items() if t < token]
        call = ScriptCall(RAISE_COUNTER, (keys.counter,), (token,))
        outcomes = await self.fan(lagging, call, what="raise the fencing counter", timeout=timeout)
        now = monotonic()
        level = sum(1 for i, t in tokens.items() if t >= token and nodes[i].counts(now))
        for node, outcome in zip(lagging, outcomes, strict=True):
            if not isinstance(outcome, BaseException) and node.counts(now):
                level += 1
        return level >= self.quorum

    def _leave_line(self, keys: LockKeys, owner: str, granted: dict[int, int]) -> None:
        """An urgent waiter's vote is won: leave its place in line on the nodes that did not
        grant (the others dropped it with their grant).  Not awaited: it goes ahead of any
        later request there; if it fails, the place lapses unasked (``watchdog_ttl``)."""
        others = [node for node in self.nodes if node.index not in granted]
        self.fan.start(others, self.abandon_call(keys, owner, "line"), Gather(len(others)))

    async def _undo(
        self, keys: LockKeys, owner: str, nodes: Sequence[Node], only: str = ""
    ) -> list[Outcome]:
        """Remove ``owner``'s keys from ``nodes``, all at once (``only``: see ABANDON)."""
        return await self.fan(
            nodes,
            self.abandon_call(keys, owner, only),
            what="abandon",
            timeout=self.config.op_timeout,
            patience=self._patience,
            decided=lambda outcomes: True,
        )

    def waiter(self, request: Request) -> Listening:
        # (every node's hub; the waiter also polls at random intervals up to retry_delay)
        delay = self.settings.retry_delay
        return Listening(
            self.board,
            [node.hub for node in self.nodes],
            self.keys_for(request.name).channel,
            # (once urgent, in line: the message that calls it names it)
            request.owner.encode("utf-8", "surrogatepass"),
            Backoff(delay, delay),
            need=self.quorum,
            bound=min(self.config.op_timeout, max(0.25, 5 * self._patience)),
            listen=False,
        )

    async def renew(self, grants: Sequence[Grant], ttl: float) -> list[float | None]:
        if not grants:
            return []
        nodes, quorum, lease_ms = self.nodes, self.quorum, ms(ttl)
        data = [grant_data(g) for g in grants]

        @functools.cache
        def call(i: int, token: int | str) -> ScriptCall:
            return ScriptCall(RENEW, (data[i].keys.lock,), (grants[i].owner, token, lease_ms))

        def calls(node: Node) -> list[ScriptCall]:
            return [call(i, d.tokens.get(node.index, "")) for i, d in enumerate(data)]

        def tally(outcomes: list[Any], now: float) -> tuple[list[int], list[int]]:
            yes = unknown = [0] * len(grants)
            for node, outcome in zip(nodes, outcomes, strict=True):
                if not isinstance(outcome, list):  # failed, or no answer (yet)
                    unknown = [u + 1 for u in unknown]
                elif node.counts(now):
                    yes = [y + (ok == 1) for y, ok in zip(yes, outcome, strict=True)]
            return yes, unknown

        def decided(replies: list[Any]) -> bool:
            yes, unknown = tally(replies, monotonic())
            return all(y >= quorum or y + u < quorum for y, u in zip(yes, unknown, strict=True))

        started = monotonic()
        outcomes = await self.fan(
            nodes,
            lambda node, deliver: node.link.eval_many(calls(node), deliver),
            what="renew",
            timeout=self.config.op_timeout * 0.8,
            patience=0.0,
            decided=decided,
        )
        now = monotonic()
        yes, unknown = tally(outcomes, now)
        drift = self.drift(ttl)
        valid = now - started + drift < ttl
        results = [started + ttl - drift if y >= quorum and valid else None for y in yes]
        undecided = sum(valid and y < quorum <= y + u for y, u in zip(yes, unknown, strict=True))
        if undecided:
            raise BackendError(
                f"redlock: renewing {undecided} of {len(grants)} lease(s) reached fewer than "
                f"{quorum} of {len(nodes)} nodes: {self.fan.errors(outcomes)}"
            )
        return results

    async def release(self, grant: Grant) -> bool:
        return await self.start_release(grant)

    def start_release(self, grant: Grant) -> Awaitable[bool]:
        nodes = self._nodes
        d = grant.data
        if not nodes or not isinstance(d, GrantData):
            return self._release_failed(grant)
        template, anyone = self._release_calls((d.keys, grant.owner))
        tokens, common = d.tokens, template.fill(d.token)
        request: ScriptCall | list[ScriptCall] = common
        if len(tokens) < len(nodes) or len(set(tokens.values())) > 1:
            # (a node without a token may have granted after the vote: any token of ours;
            # one whose counter lagged, raised since, has its own)
            calls = {t: common if t == d.token else template.fill(t) for t in tokens.values()}
            request = [calls[tokens[i]] if i in tokens else anyone for i in range(len(nodes))]
        tally = Votes(len(nodes), self.quorum, acquire=False)
        self.fan.start(nodes, request, tally)
        return self._finish_release(grant, tally)

    async def _release_failed(self, grant: Grant) -> bool:
        grant_data(grant)  # TypeError for a grant of another backend
        raise BackendError("redlock: the backend is not open")

    async def _finish_release(self, grant: Grant, tally: Votes) -> bool:
        await self.fan.finish(tally, timeout=self.config.op_timeout, patience=0.0)
        if tally.yes >= tally.need:
            return True
        n = len(tally.replies)
        if tally.no > n - tally.need:
            return False
        outcomes = self.fan.outcomes(self.nodes, tally.replies, "release", self.config.op_timeout)
        raise BackendError(
            f"redlock: the release of {grant.name!r} reached only {tally.yes + tally.no} of "
            f"{n} nodes ({tally.yes} released); the rest expires with the lease: "
            f"{self.fan.errors(outcomes)}"
        )

    async def abandon(self, request: Request) -> None:
        outcomes = await self._undo(self.keys_for(request.name), request.owner, self.nodes)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise BackendError(
                f"redlock: could not clean up {request.name!r} on {len(failed)} node(s) yet "
                f"(what is left there expires with its lease): {self.fan.errors(outcomes)}"
            )

    async def status(self, name: str) -> LockStatus | None:
        call = self.status_call(name)
        outcomes = await self._majority(call, "status", self.config.op_timeout)
        holders: dict[str, list[tuple[int, int]]] = {}
        for outcome in outcomes:
            if outcome and not isinstance(outcome, BaseException):
                raw_owner, token, pttl = outcome[0], int(outcome[1]), int(outcome[2])
                owner = raw_owner.decode("utf-8", "surrogateescape")
                holders.setdefault(owner, []).append((token, pttl))
        for owner, held in holders.items():
            if len(held) >= self.quorum:
                token = max(t for t, _ in held)
                # The lease lasts while a majority of its keys do.
                pttls = sorted((p for _, p in held), reverse=True)
                left = pttls[self.quorum - 1]
                return LockStatus(name, owner, token, left / 1000 if left >= 0 else None, None)
        return None

    async def force_release(self, name: str) -> bool:
        call = self.force_release_call(name)
        outcomes = await self._majority(call, f"force_release of {name!r}", self.config.op_timeout)
        return any(o == 1 for o in outcomes)


def grant_data(grant: Grant) -> GrantData:
    data = grant.data
    if not isinstance(data, GrantData):
        raise TypeError(f"not a redlock grant: {grant!r}")
    return data
