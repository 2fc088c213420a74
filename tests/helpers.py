"""Helpers every test folder shares: open-client factories and polling with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import anyio
import pytest

import aiodlock

#: Generous upper bound for "this must not hang" (the machine is shared and loaded).
HANG = 30.0

ROOT = Path(__file__).resolve().parents[1]
#: The one cross-process worker (see its docstring for the modes).
WORKER = Path(__file__).with_name("worker.py")


def worker_command(*args: str) -> list[str]:
    """The command line of a worker process: ``worker_command("hold", url, name, ...)``."""
    return [sys.executable, str(WORKER), *args]


def worker_env() -> dict[str, str]:
    """The environment of a worker process: this checkout importable, no AIODLOCK_URL."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("AIODLOCK_URL", None)
    return env


class Cycle(NamedTuple):
    """One line of a ``cycles`` worker's log."""

    token: int
    pid: int
    entered: float
    left: float
    state: str


def read_cycles(log: Path) -> list[Cycle]:
    """The cycles the workers logged, in the order they entered."""
    rows = [line.split() for line in log.read_text().splitlines()]
    cycles = [Cycle(int(t), int(p), float(e), float(lf), st) for t, p, e, lf, st in rows]
    return sorted(cycles, key=lambda c: c.entered)


async def start_worker(*args: str, cwd: Path | None = None) -> asyncio.subprocess.Process:
    """Run tests/worker.py in another Python process (stdout and stderr piped)."""
    return await asyncio.create_subprocess_exec(
        *worker_command(*args),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=worker_env(),
    )


async def read_line(proc: asyncio.subprocess.Process, timeout: float = HANG) -> str:
    """The worker's next line (an AssertionError with its stderr when it ended instead)."""
    assert proc.stdout is not None
    async with asyncio.timeout(timeout):
        line = await proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        err = await proc.stderr.read()
        raise AssertionError(f"worker ended early: {err.decode(errors='replace')[-2000:]}")
    return line.decode().strip()


async def reap(proc: asyncio.subprocess.Process) -> None:
    """Kill the worker if it still runs, and wait for it."""
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def run_cycles(
    url: str, processes: int, rounds: int, log: Path, *options: str, timeout: float = 120.0
) -> list[Cycle]:
    """``processes`` workers each take the name ``shared`` ``rounds`` times (``cycles`` mode),
    every one to its end; the cycles they logged, in the order they entered."""
    args = ("cycles", url, "shared", str(rounds), str(log), *options)
    procs = [await start_worker(*args, cwd=log.parent) for _ in range(processes)]
    try:
        for proc in procs:
            assert await read_line(proc, timeout=timeout) == "done"
            assert await proc.wait() == 0
    finally:
        for proc in procs:
            await reap(proc)
    return read_cycles(log)


def assert_exclusive(cycles: list[Cycle], processes: int, rounds: int) -> None:
    """Every cycle logged, none overlapping another, tokens strictly increasing in the order
    of entry, every process among the holders."""
    assert len(cycles) == processes * rounds
    for cycle, after in itertools.pairwise(cycles):
        assert cycle.left <= after.entered  # nobody came in between
    assert [c.state for c in cycles].count("OVERLAP") == 0
    tokens = [c.token for c in cycles]
    assert tokens == sorted(set(tokens)), "tokens must strictly increase in order of entry"
    assert len({c.pid for c in cycles}) == processes


class Serving:
    """A worker process in ``serve`` mode, driven line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, command: str, expect: str, timeout: float = 30) -> str:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        with anyio.fail_after(timeout):
            line = (await self.proc.stdout.readline()).decode().strip()
        word, _, value = line.partition(" ")
        assert word == expect, line
        return value


#: ``await serve(url, name, "option=value", ...)`` (the ``serve`` fixture of tests/conftest.py)
ServeFactory = Callable[..., Awaitable[Serving]]


@contextlib.asynccontextmanager
async def serving(cwd: Path) -> AsyncIterator[ServeFactory]:
    """A :data:`ServeFactory` whose worker processes are killed on exit."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(url: str, name: str, *options: str) -> Serving:
        proc = await asyncio.create_subprocess_exec(
            *worker_command("serve", url, name, *options),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=worker_env(),
        )
        procs.append(proc)
        return Serving(proc)

    try:
        yield start
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


class ClientFactory(Protocol):
    """``await make_client(url=None, **options)``: an open client, closed at teardown."""

    def __call__(self, url: str | None = None, **options: Any) -> Awaitable[aiodlock.Client]: ...


@contextlib.asynccontextmanager
async def open_clients(default_url: str, **defaults: Any) -> AsyncIterator[ClientFactory]:
    """A :class:`ClientFactory` on ``default_url``; ``defaults`` fill options not given."""
    clients: list[aiodlock.Client] = []

    async def make(url: str | None = None, **options: Any) -> aiodlock.Client:
        for key, value in defaults.items():
            options.setdefault(key, value)
        client = aiodlock.connect(url or default_url, **options)
        await client.open()
        clients.append(client)
        return client

    # (for a test that makes a client of its own on the same URL and options)
    make.url = default_url  # type: ignore[attr-defined]
    make.options = dict(defaults)  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for client in reversed(clients):
            with contextlib.suppress(Exception):
                await client.close()


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], timeout: float = HANG, what: str = ""
) -> None:
    """Poll ``check`` until it is true (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s {what}".strip())
        await asyncio.sleep(0.01)


def make_tls_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 (openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "1", "-subj", "/CN=aiodlock-test-ca")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    (directory / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext.cnf")  # fmt: skip
    return directory / "ca.crt", directory / "server.crt", directory / "server.key"


def tls_server_args(port: int, ca: Path, cert: Path, key: Path) -> list[str]:
    """``redis-server`` arguments for a TLS port with the certificates of
    :func:`make_tls_certs` (clients need not show a certificate)."""
    return [
        "--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
    ]  # fmt: skip


def in_threads(*coroutines: Coroutine[Any, Any, None]) -> None:
    """Run each coroutine under its own ``asyncio.run`` in a thread of its own."""
    errors: list[BaseException] = []

    def run(coroutine: Coroutine[Any, Any, None]) -> None:
        try:
            asyncio.run(coroutine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in coroutines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG * 2)
        assert not thread.is_alive(), "a thread still runs: a waiter was never woken"
    if errors:
        raise errors[0]


async def take_turns(
    clients: list[aiodlock.Client], name: str, tasks: int, rounds: int
) -> list[int]:
    """``tasks`` tasks, spread over ``clients``, take ``name`` ``rounds`` times each, one at
    a time (checked); the tokens, in the order they were granted."""
    inside = 0
    tokens: list[int] = []

    async def worker(client: aiodlock.Client) -> None:
        nonlocal inside
        for _ in range(rounds):
            async with client.lock(name, timeout=HANG) as lease:
                inside += 1
                assert inside == 1
                tokens.append(lease.token)
                await asyncio.sleep(0.001)
                inside -= 1

    await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(tasks)))
    assert len(tokens) == tasks * rounds
    assert tokens == sorted(set(tokens)), "tokens must strictly increase in order of entry"
    return tokens
