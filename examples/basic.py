"""The basics: one lock, several workers, a fencing token.

python examples/basic.py                      # the embedded SQLite default
AIODLOCK_URL=redis://127.0.0.1:6379/0 python examples/basic.py
"""

from __future__ import annotations

import asyncio

import aiodlock


async def worker(client: aiodlock.Client, n: int, log: list[int]) -> None:
    async with client.lock("examples:basic", timeout=10) as lease:
        # Only one worker at a time gets here, on any host using the same URL.
        log.append(lease.token)
        print(f"worker {n} holds the lock with fencing token {lease.token}")
        await asyncio.sleep(0.01)


async def main() -> None:
    async with aiodlock.connect() as client:
        log: list[int] = []
        await asyncio.gather(*(worker(client, n, log) for n in range(5)))
        assert log == sorted(log), "tokens strictly increase"


if __name__ == "__main__":
    asyncio.run(main())
