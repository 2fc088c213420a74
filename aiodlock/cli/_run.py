"""``aiodlock run``: run a command while holding a lock, and stop it if the lease is lost."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator

import anyio

from .. import BackendError, Client, Lease, Lock, LockError, LockLost, LockTimeout
from ._common import (
    EX_COMMAND_NOT_FOUND,
    EX_CONFIG,
    EX_LOST,
    EX_NOT_EXECUTABLE,
    EX_TEMPFAIL,
    _Exit,
    _make_client,
    _say,
)

_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _terminal_sends_to_child() -> bool:
    """Did a keyboard SIGINT also reach the child (same foreground process group)?"""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass
class _Signals:
    """Signals that reached ``aiodlock run``, and what to do with them."""

    cancel_wait: anyio.CancelScope
    child: asyncio.subprocess.Process | None = None
    received: int | None = None

    def handle(self, signum: int) -> None:
        if self.received is None:
            self.received = signum
        child = self.child
        if child is None:
            # Still connecting or waiting for the lock: give up, the command never runs.
            self.cancel_wait.cancel()
            return
        if child.returncode is not None:
            return
        if signum == signal.SIGINT and _terminal_sends_to_child():
            return  # the terminal sent it to the whole foreground group already
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)


@contextlib.contextmanager
def _signal_handlers(handler: Callable[[int], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    try:
        for sig in _FORWARDED_SIGNALS:
            try:
                loop.add_signal_handler(sig, handler, int(sig))
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover
                continue
            installed.append(int(sig))
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def _cmd_run(args: argparse.Namespace) -> int:
    command: list[str] = args.command_args
    if not command:
        raise _Exit(
            EX_CONFIG,
            "run: no command given; usage: aiodlock run NAME [options] -- COMMAND [ARGS...]",
        )
    signals = _Signals(anyio.CancelScope())
    client = _make_client(args)
    lock = client.lock(args.name, ttl=args.ttl, timeout=args.timeout, on_lost="ignore")
    with _signal_handlers(signals.handle):
        try:
            lease: Lease | None = None
            with signals.cancel_wait:  # a signal before the command starts cancels this
                await client.open()
                lease = await _acquire(client, lock, args)
            if lease is None or signals.received is not None:
                if lease is not None:
                    await lock.release()
                received = signals.received or int(signal.SIGINT)
                raise _Exit(
                    128 + received,
                    f"{signal.Signals(received).name} while waiting for lock "
                    f"{args.name!r}; the command did not run",
                )
            if args.verbose:
                _say(f"acquired lock {args.name!r} (token {lease.token}, owner {lease.owner})")
            try:
                return await _supervise(args, command, lease, signals)
            finally:
                lost_before_release = lease.lost
                try:
                    await lock.release()
                except (BackendError, LockLost) as exc:
                    _say(f"releasing lock {args.name!r} failed ({exc}); it ends with its lease")
                else:
                    if args.verbose and not lost_before_release:
                        _say(f"released lock {args.name!r}")
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
        holder = await client.status(args.name)
        _say(
            f"waiting for lock {args.name!r}"
            + (f" (held by {holder.owner}, token {holder.token})" if holder else "")
        )
        timeout = None if args.timeout is None else args.timeout - (time.monotonic() - started)
        return await lock.acquire(timeout=max(0.0, timeout) if timeout is not None else None)
    except LockTimeout:
        raise _Exit(EX_TEMPFAIL, await _busy_message(client, args)) from None


async def _busy_message(client: Client, args: argparse.Namespace) -> str:
    holder = ""
    with contextlib.suppress(LockError, OSError), anyio.move_on_after(client.config.op_timeout):
        status = await client.status(args.name)
        if status is not None:
            holder = f" (held by {status.owner}, token {status.token})"
    if args.timeout == 0:
        return f"lock {args.name!r} is busy{holder}; the command did not run"
    return f"lock {args.name!r} not acquired within {args.timeout:g} s{holder}; not run"


async def _supervise(
    args: argparse.Namespace, command: list[str], lease: Lease, signals: _Signals
) -> int:
    env = dict(os.environ)
    env["AIODLOCK_NAME"] = args.name
    env["AIODLOCK_TOKEN"] = str(lease.token)
    env["AIODLOCK_OWNER"] = lease.owner
    try:
        child = await asyncio.create_subprocess_exec(*command, env=env)
    except FileNotFoundError:
        raise _Exit(EX_COMMAND_NOT_FOUND, f"command not found: {command[0]}") from None
    except OSError as exc:
        raise _Exit(EX_NOT_EXECUTABLE, f"cannot run {command[0]}: {exc.strerror}") from None
    signals.child = child
    if signals.received is not None:  # arrived while the command was being started
        signals.handle(signals.received)
    waiting = asyncio.ensure_future(child.wait())
    lost = asyncio.ensure_future(lease.wait_lost())
    try:
        await asyncio.wait({waiting, lost}, return_when=asyncio.FIRST_COMPLETED)
        if child.returncode is None or lease.lost:
            # The lease is gone: the command runs unprotected.  Stop it.
            reason = lease.lost_reason or "the lease was lost"
            if child.returncode is None:
                _say(
                    f"lost lock {args.name!r} ({reason}); stopping the command "
                    f"(SIGTERM, SIGKILL after {args.grace:g} s)"
                )
                code = await _stop(child, args.grace)
                _say(f"the command was stopped; its status: {_exit_status(code)}")
            else:
                _say(
                    f"lost lock {args.name!r} ({reason}) before the command ended "
                    f"(its status: {_exit_status(child.returncode)})"
                )
            return EX_LOST
        return _exit_status(child.returncode)
    finally:
        for task in (waiting, lost):
            task.cancel()
        if child.returncode is None:  # an error or a cancellation of our own: never orphan
            with anyio.CancelScope(shield=True):
                await _stop(child, args.grace)


async def _stop(child: asyncio.subprocess.Process, grace: float) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the child's return code."""
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    with anyio.move_on_after(grace):
        return await child.wait()
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    return await child.wait()
