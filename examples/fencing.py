"""Why fencing tokens matter: a storage that rejects writes from an outdated holder.

A process that was paused past its lease (GC, SIGSTOP, a VM migration) may still believe it
holds the lock.  The storage keeps the newest token it has seen and refuses older ones.

    python examples/fencing.py
"""

from __future__ import annotations

import asyncio

import aiodlock


class Storage:
    def __init__(self) -> None:
        self.newest_token = 0
        self.value: str | None = None

    def write(self, value: str, token: int) -> None:
        if token < self.newest_token:
            raise PermissionError(f"token {token} is older than {self.newest_token}")
        self.newest_token = token
        self.value = value


async def main() -> None:
    storage = Storage()
    async with aiodlock.connect("memory://fencing-example") as client:
        slow = await client.lock("doc", ttl=0.2, on_lost="ignore").acquire()
        stale_token = slow.token
        await slow.wait_lost()  # the slow holder is "paused" past its lease

        async def fast_writer() -> None:
            async with client.lock("doc") as lease:
                storage.write("from the new holder", lease.token)

        await asyncio.create_task(fast_writer())
        try:
            storage.write("from the old holder", stale_token)
        except PermissionError as exc:
            print("rejected the outdated holder:", exc)
        await client.lock("doc").release()
    print("stored:", storage.value)


if __name__ == "__main__":
    asyncio.run(main())
