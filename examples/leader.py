"""Leader election: start it in several processes (or hosts); one leads, the others wait.

    python examples/leader.py &                       # the embedded default
    python examples/leader.py &
    AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/leader.py --watchdog-ttl 10

The leader is whoever holds the lock ``leader:<name>``.  Its work runs inside the
``async with``, so:

- the lease is renewed by the client's watchdog while the leader lives (every
  ``watchdog_ttl/3``); a leader that dies (crash, SIGKILL, a lost host) stops renewing, and
  a follower takes over when the lease it renewed last runs out: within ``watchdog_ttl``
  seconds (plus a SQLite waiter's poll interval).  A smaller ``--watchdog-ttl`` means a
  faster take-over and more renewals;
- a leader that *loses* its lease (renewals failed until it ran out, an admin's
  ``aiodlock release --force``) has its work cancelled (``on_lost="cancel"``, the default):
  it stops as soon as the client notices (at the latest at its next renewal) rather than
  go on believing it leads, and goes back to waiting;
- a leader that is stopped (Ctrl-C, SIGTERM) releases the lock on its way out, and a
  follower takes over at once instead of waiting the lease out.

Between the moment a leader stops being able to renew and the moment it notices, another may
already lead: pass ``lease.token`` (the fencing token, larger for every new leader) with
whatever the leader writes, and let the storage refuse older tokens (examples/fencing.py).

Each line it prints starts with the time (Unix seconds) and the process id:
``waiting``, ``leading token=N owner=...``, ``tick token=N n=K``, ``lost token=N``,
``stopped``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

import aiodlock

log = logging.getLogger("leader")


async def work(lease: aiodlock.Lease, tick: float) -> None:
    """What the leader does while it leads: here a tick now and then.  Cancelled when the
    lease is lost; real work would pass ``lease.token`` along with its writes."""
    n = 0
    while True:
        n += 1
        log.info("tick token=%d n=%d", lease.token, n)
        await asyncio.sleep(tick)


async def lead(client: aiodlock.Client, name: str, tick: float) -> None:
    """Wait to lead, lead until the lease is lost, then wait again; for ever."""
    lock = client.lock(f"leader:{name}")  # watchdog lease; a lost lease cancels the body
    while True:
        log.info("waiting")
        token = None
        try:
            async with lock as lease:  # waits (event-driven) until the leader is gone
                token = lease.token
                log.info("leading token=%d owner=%s", lease.token, lease.owner)
                await work(lease, tick)
        except aiodlock.LockLost:
            log.info("lost token=%d", token)
        except aiodlock.BackendError as exc:  # the server is unreachable: try again soon
            log.warning("lock service failed (%s); token=%s", exc, token)
            await asyncio.sleep(1.0)


async def main() -> None:
    parser = argparse.ArgumentParser(description="One of us leads; the others take over.")
    parser.add_argument("--name", default="example", help="the group's name")
    parser.add_argument("--watchdog-ttl", type=float, help="lease seconds (default: the URL's)")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between ticks")
    args = parser.parse_args()
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(created).6f %(process)d %(message)s"
    )
    options = {} if args.watchdog_ttl is None else {"watchdog_ttl": args.watchdog_ttl}
    # connect() with no URL reads AIODLOCK_URL, else uses the embedded SQLite default.
    async with aiodlock.connect(**options) as client:
        leading = asyncio.current_task()
        assert leading is not None

        def stop() -> None:
            # (said before the work is cancelled: the next leader may start as soon as the
            # `async with`s have released the lock, and closed the client)
            log.info("stopped")
            leading.cancel()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):  # step down on either, or Ctrl-C
            loop.add_signal_handler(signum, stop)
        with contextlib.suppress(asyncio.CancelledError):
            await lead(client, args.name, args.tick)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):  # (a Ctrl-C before the handlers are set)
        asyncio.run(main())
