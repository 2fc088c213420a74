"""``aiodlock run``: run a command while holding a lock, and stop it if the lease is lost."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import time

import anyio

from .. import BackendError, Client, Lease, Lock, LockError, LockLost, LockTimeout
from ._common import Exit, ExitStatus, held_by, make_client, say


def _terminal_sends_to_child() -> bool:
    """Did a keyboard SIGINT also reach the child (same foreground process group)?"""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
    return False


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass
class _Signals:
    """SIGINT, SIGTERM and SIGHUP that reached ``aiodlock run``, and what to do with them."""

    cancel_wait: anyio.CancelScope
    child: asyncio.subprocess.Process | None = None
    received: int | None = None

    def handle(self, signum: int) -> None:
        if self.received is None:
            self.received = signum
        child = self.child
        if child is None:  # still connecting or waiting: give up, the command never runs
            self.cancel_wait.cancel()
        elif child.returncode is None and not (
            signum == signal.SIGINT and _terminal_sends_to_child()  # it has it already
        ):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)


async def cmd_run(args: argparse.Namespace) -> int:
    if not args.command_args:
        raise Exit(
            ExitStatus.CONFIG,
            "run: no command given; usage: aiodlock run NAME [options] -- COMMAND [ARGS...]",
        )
    signals = _Signals(anyio.CancelScope())
    client = make_client(args)
    lock = client.lock(args.name, ttl=args.ttl, timeout=args.timeout, on_lost="ignore")
    loop = asyncio.get_running_loop()
    with contextlib.ExitStack() as installed:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, signals.handle, int(sig))
                installed.callback(loop.remove_signal_handler, sig)
        try:
            lease: Lease | None = None
            with signals.cancel_wait:  # a signal before the command starts cancels this
                await client.open()
                lease = await _acquire(client, lock, args)
            if signals.received is not None:  # (the only reason for a lease still None)
                if lease is not None:
                    await lock.release()
                raise Exit(
                    128 + signals.received,
                    f"{signal.Signals(signals.received).name} while waiting for lock "
                    f"{args.name!r}; the command did not run",
                )
            assert lease is not None
            if args.verbose:
                say(f"acquired lock {args.name!r} (token {lease.token}, owner {lease.owner})")
            try:
                status = await _supervise(args, lease, signals)
            finally:
                try:
                    await lock.release()  # finds a lease lost since the last renewal
                except (BackendError, LockLost) as exc:
                    say(f"releasing lock {args.name!r} failed ({exc}); it ends with its lease")
                else:
                    if args.verbose and not lease.lost:
                        say(f"released lock {args.name!r}")
            if status is None:
                return ExitStatus.LOST
            if lease.lost:  # the command ran unprotected for a while: that is what counts
                say(
                    f"lost lock {args.name!r} ({lease.lost_reason}) before the command ended "
                    f"(its status: {status})"
                )
                return ExitStatus.LOST
            return status
        finally:
            await client.close()


async def _acquire(client: Client, lock: Lock, args: argparse.Namespace) -> Lease:
    started = time.monotonic()
    try:
        if not args.verbose:
            return await lock.acquire()
        lease = await lock.try_acquire()
        if lease is not None:
            return lease
        if args.timeout == 0:
            raise LockTimeout(f"lock {args.name!r} is busy")
        say(f"waiting for lock {args.name!r}{held_by(await client.status(args.name))}")
        left = None if args.timeout is None else args.timeout - (time.monotonic() - started)
        return await lock.acquire(timeout=None if left is None else max(0.0, left))
    except LockTimeout:
        holder = ""
        with contextlib.suppress(LockError, OSError), anyio.move_on_after(client.config.op_timeout):
            holder = held_by(await client.status(args.name))
        busy = f"is busy{holder}; the command did not run"
        if args.timeout:
            busy = f"not acquired within {args.timeout:g} s{holder}; not run"
        raise Exit(ExitStatus.TEMPFAIL, f"lock {args.name!r} {busy}") from None


async def _supervise(args: argparse.Namespace, lease: Lease, signals: _Signals) -> int | None:
    """The command's exit status; None when a lost lease stopped it (and that was said)."""
    command: list[str] = args.command_args
    env = dict(os.environ, AIODLOCK_NAME=args.name, AIODLOCK_OWNER=lease.owner)
    env["AIODLOCK_TOKEN"] = str(lease.token)
    try:
        child = await asyncio.create_subprocess_exec(*command, env=env)
    except FileNotFoundError:
        raise Exit(ExitStatus.COMMAND_NOT_FOUND, f"command not found: {command[0]}") from None
    except OSError as exc:
        raise Exit(ExitStatus.NOT_EXECUTABLE, f"cannot run {command[0]}: {exc.strerror}") from None
    signals.child = child
    if signals.received is not None:  # arrived while the command was being started
        signals.handle(signals.received)
    waiting = asyncio.ensure_future(child.wait())
    lost = asyncio.ensure_future(lease.wait_lost())
    try:
        await asyncio.wait({waiting, lost}, return_when=asyncio.FIRST_COMPLETED)
        if child.returncode is not None:
            return _exit_status(child.returncode)
        say(
            f"lost lock {args.name!r} ({lease.lost_reason}); stopping the command "
            f"(SIGTERM, SIGKILL after {args.grace:g} s)"
        )
        say(f"the command was stopped; its status: {_exit_status(await _stop(child, args))}")
        return None
    finally:
        for task in (waiting, lost):
            task.cancel()
        if child.returncode is None:  # an error or a cancellation of our own: never orphan
            with anyio.CancelScope(shield=True):
                await _stop(child, args)


async def _stop(child: asyncio.subprocess.Process, args: argparse.Namespace) -> int:
    """SIGTERM, then SIGKILL after ``--grace`` seconds; the child's return code."""
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    with anyio.move_on_after(args.grace):
        return await child.wait()
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    return await child.wait()
