"""examples/leader.py end to end: one of several processes leads; a dead leader's place is
taken within the lease time; a lost lease cancels the leader's work; a stopped leader hands
over at once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest

import aiodlock
from tests.helpers import HANG, eventually

from .conftest import RunExample

pytestmark = pytest.mark.slow  # (processes that lead, die and take over: seconds each)

NAME = "leader:example"
#: the leaders' lease in the tests that wait for one to run out
TTL = 1.0
#: what a loaded machine may add to a take-over (scheduling, SQLite's poll interval)
SLACK = 1.0


class Event(NamedTuple):
    at: float  # time.time() in the leader's process
    kind: str  # waiting, leading, tick, lost, stopped
    token: int  # (0 where the line has none)
    owner: str | None


class Leader:
    """A leader.py process whose lines are read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[Event] = []
        self.lines: list[str] = []
        self.killed_at: float | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.lines.append(line)
            at, _, rest = line.partition(" ")
            pid, _, rest = rest.partition(" ")
            if pid != str(self.proc.pid):
                continue  # (a library's warning, a traceback)
            kind, *pairs = rest.split()
            fields = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
            token = fields.get("token", "")
            token_ = int(token) if token.isdigit() else 0
            self.events.append(Event(float(at), kind, token_, fields.get("owner")))

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def kill(self) -> None:
        self.killed_at = time.time()
        self.proc.send_signal(signal.SIGKILL)


@contextlib.asynccontextmanager
async def leaders(run_example: RunExample, count: int, ttl: float) -> AsyncIterator[list[Leader]]:
    args = ("--watchdog-ttl", str(ttl), "--tick", "0.05")
    started = [Leader(await run_example("leader.py", *args)) for _ in range(count)]
    try:
        # Every one is up and in its loop: waiting, or already leading.
        await eventually(lambda: all(p.of("waiting") for p in started), what="all started")
        yield started
    finally:
        for leader in started:
            leader.reader.cancel()


def leading(processes: list[Leader]) -> list[tuple[Leader, Event]]:
    """Every leadership so far, in the order they began."""
    return sorted(((p, e) for p in processes for e in p.of("leading")), key=lambda pe: pe[1].at)


async def one_leader_for_a_while(processes: list[Leader], after: int = 0) -> Leader:
    """Wait for leadership number ``after + 1``; while its holder ticks 5 times, nobody else
    becomes leader.  The leader."""
    await eventually(lambda: len(leading(processes)) > after, what="a leader")
    await asyncio.sleep(0)
    chosen, event = leading(processes)[after]

    def ticks() -> int:
        return sum(1 for e in chosen.of("tick") if e.token == event.token)

    await eventually(lambda: ticks() >= 5, what="the leader's ticks")
    assert len(leading(processes)) == after + 1, "\n\n".join(p.output() for p in processes)
    return chosen


def assert_one_at_a_time(processes: list[Leader]) -> None:
    """Leaderships, each from its 'leading' to its end (lost, stopped, killed, or now), never
    overlap, and their tokens increase."""
    spans: list[tuple[float, float, int]] = []
    for p in processes:
        ends = sorted(e.at for e in p.events if e.kind in ("lost", "stopped"))
        if p.killed_at is not None:
            ends.append(p.killed_at)
        for began in p.of("leading"):
            end = min([at for at in ends if at >= began.at], default=time.time())
            spans.append((began.at, end, began.token))
    spans.sort()
    for (_, end, token), (start, _, later) in itertools.pairwise(spans):
        assert end <= start, spans
        assert token < later, spans


async def test_three_processes_one_leads_and_a_killed_leader_is_replaced(
    run_example: RunExample, example_url: str
) -> None:
    async with leaders(run_example, 3, TTL) as processes:
        first = await one_leader_for_a_while(processes)
        (lead,) = first.of("leading")
        async with aiodlock.connect(example_url) as client:
            status = await client.lock(NAME).status()
        assert status is not None
        assert (status.owner, status.token) == (lead.owner, lead.token)

        first.kill()
        assert first.killed_at is not None
        second = await one_leader_for_a_while(processes, after=1)
        assert second is not first
        (took_over,) = second.of("leading")
        assert took_over.token > lead.token
        # Within the lease time: the lease the dead leader had last renewed ran out.
        assert took_over.at - first.killed_at <= TTL + SLACK
        assert_one_at_a_time(processes)
        # The third stayed a follower throughout.
        (third,) = [p for p in processes if p not in (first, second)]
        assert not third.of("leading")


async def test_a_lost_lease_cancels_the_leaders_work(
    run_example: RunExample, example_url: str
) -> None:
    async with leaders(run_example, 2, TTL) as processes:
        leader = await one_leader_for_a_while(processes)
        (lead,) = leader.of("leading")
        async with aiodlock.connect(example_url) as client:
            await client.force_release(NAME)  # an admin breaks the lock
        # The leader notices at its next renewal (TTL/3), its work is cancelled...
        await eventually(lambda: bool(leader.of("lost")), timeout=HANG)
        (lost,) = leader.of("lost")
        assert lost.token == lead.token
        # ...and it goes back to waiting; whoever leads next has a larger token.
        await eventually(lambda: len(leading(processes)) == 2, what="a new leader")
        after = [e for p, e in leading(processes) if e is not lead]
        assert after[0].token > lead.token
        assert not [e for e in leader.of("tick") if e.token == lead.token and e.at > lost.at]
        assert leader.proc.returncode is None, leader.output()


async def test_a_stopped_leader_hands_over_at_once(
    run_example: RunExample, example_url: str
) -> None:
    ttl = 60.0  # (a hand-over long before the lease could have run out)
    async with leaders(run_example, 2, ttl) as processes:
        leader = await one_leader_for_a_while(processes)
        stopped_at = time.time()
        leader.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(HANG):
            assert await leader.proc.wait() == 0, leader.output()
        await leader.reader
        assert leader.of("stopped")
        (other,) = [p for p in processes if p is not leader]
        await eventually(lambda: bool(other.of("leading")), what="the follower takes over")
        assert other.of("leading")[0].at - stopped_at < 10.0
        assert_one_at_a_time(processes)
