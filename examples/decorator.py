"""One report build per user at a time, whichever task or process asks.

python examples/decorator.py
"""

from __future__ import annotations

import asyncio

import aiodlock

client = aiodlock.connect("memory://decorator-example")


@client.locked("report:{user_id}", timeout=30)
async def build_report(user_id: int) -> str:
    await asyncio.sleep(0.05)
    return f"report for user {user_id}"


async def main() -> None:
    async with client:
        # The two calls for user 1 run one after the other; user 2 runs alongside.
        print(await asyncio.gather(build_report(1), build_report(1), build_report(2)))


if __name__ == "__main__":
    asyncio.run(main())
