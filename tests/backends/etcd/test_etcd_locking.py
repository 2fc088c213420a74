"""The etcd protocol against a real member: keys, tokens, the line, wake-ups, clean-up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from etcd3aio import Etcd3Client

import aiodlock
from aiodlock.backends.etcd import EtcdBackend
from tests.helpers import HANG, ClientFactory, eventually
from tests.servers import EtcdServer

from .etcd_helpers import backend_of, keys

pytestmark = pytest.mark.etcd


async def test_key_layout_lease_and_create_revision_token(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    client = await make_client()
    backend = backend_of(client)
    prefix = backend.keys.prefix("orders:42")
    async with client.lock("orders:42") as lease:
        assert backend.session is not None
        [key] = await keys(raw, prefix)
        assert (
            key == f"/{client.config.namespace}/locks/orders:42/{backend.session.lease:x}".encode()
        )
        assert key == backend.keys.key(prefix, backend.session.lease)
        assert raw.kv is not None
        [kv] = (await raw.kv.get(key)).kvs
        assert lease.token == kv.create_revision
        assert kv.lease == backend.session.lease
        assert kv.value.decode() == lease.owner
        status = await client.status("orders:42")
        assert status is not None
        assert (status.owner, status.token, status.waiters) == (lease.owner, lease.token, 0)
        assert status.expires_in is not None
        assert 0 < status.expires_in <= 5
    assert await keys(raw, prefix) == []


async def test_host_names_work_as_endpoints(
    make_client: ClientFactory, etcd_server: EtcdServer
) -> None:
    client = await make_client(f"etcd://localhost:{etcd_server.port},127.0.0.1:{etcd_server.port}")
    async with client.lock("by-name") as lease:
        assert lease.token > 0


@pytest.mark.parametrize(
    "name",
    ["a/b/c", "/", "100%", " spaced out ", "nul\x00in\nname", "Ключ 鍵 🔒", "x" * 512],
    ids=["slashes", "slash", "percent", "spaces", "control", "unicode", "512"],
)
async def test_any_name_is_one_lock(
    make_client: ClientFactory, raw: Etcd3Client, name: str
) -> None:
    a = await make_client()
    b = await make_client()
    async with a.lock(name) as lease:
        assert await b.lock(name).try_acquire() is None
        status = await b.lock(name).status()
        assert status is not None
        assert (status.owner, status.name) == (lease.owner, name)
        locks = f"/{a.config.namespace}/locks/".encode()
        assert len(await keys(raw, locks)) == 1
        variant = name[:-1] + ("Y" if name[-1] != "Y" else "y")
        assert await b.lock(variant).try_acquire() is not None
        await b.lock(variant).release()
    assert await b.lock(name).try_acquire() is not None
    await b.lock(name).release()


async def test_fifo_order_across_clients(make_client: ClientFactory) -> None:
    clients = [await make_client() for _ in range(3)]
    holder = clients[0].lock("fifo")
    await holder.acquire()
    order: list[int] = []
    queued: list[asyncio.Task[None]] = []

    async def take(i: int) -> None:
        async with clients[i % 3].lock("fifo", timeout=HANG):
            order.append(i)

    for i in range(6):
        queued.append(asyncio.create_task(take(i)))
        await eventually(lambda n=i + 1: _waiting(clients[0], "fifo", n), what="queued")
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*queued), HANG)
    assert order == list(range(6))


async def _waiting(client: aiodlock.Client, name: str, n: int) -> bool:
    status = await client.status(name)
    return status is not None and status.waiters == n


@pytest.mark.parametrize("waiters", [1, 10, 100])
async def test_one_wake_up_per_release(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, waiters: int
) -> None:
    """Each waiter watches only the key just ahead: a release wakes one waiter, which asks
    once more and holds.  Counted as attempts: one to queue, one after its wake-up."""
    holder = await make_client()
    waiting = await make_client()
    attempts: dict[str, int] = {}
    original = EtcdBackend.try_acquire

    async def counted(self: EtcdBackend, request: aiodlock.Request, **kw: Any) -> Any:
        if self is backend_of(waiting):
            attempts[request.owner] = attempts.get(request.owner, 0) + 1
        return await original(self, request, **kw)

    monkeypatch.setattr(EtcdBackend, "try_acquire", counted)
    lock = holder.lock("herd")
    await lock.acquire()
    done: list[int] = []

    async def take(i: int) -> None:
        async with waiting.lock("herd", timeout=HANG):
            done.append(i)

    tasks = [asyncio.create_task(take(i)) for i in range(waiters)]
    await eventually(lambda: _waiting(holder, "herd", waiters), what="all queued")
    await lock.release()
    await asyncio.wait_for(asyncio.gather(*tasks), HANG)
    assert sorted(done) == list(range(waiters))
    assert sorted(attempts.values()) == [2] * waiters


async def test_try_lock_and_timeout_leave_no_key(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    a = await make_client()
    b = await make_client()
    prefix = backend_of(a).keys.prefix("busy")
    async with a.lock("busy"):
        [held] = await keys(raw, prefix)
        assert await b.lock("busy").try_acquire() is None
        assert await keys(raw, prefix) == [held]
        with pytest.raises(aiodlock.LockTimeout):
            await b.lock("busy").acquire(timeout=0.2)
        assert await keys(raw, prefix) == [held]


async def test_cancelled_waiter_leaves_no_key(make_client: ClientFactory, raw: Etcd3Client) -> None:
    a = await make_client()
    b = await make_client()
    prefix = backend_of(a).keys.prefix("cancel")
    async with a.lock("cancel"):
        task = asyncio.create_task(b.lock("cancel").acquire())
        await eventually(lambda: _waiting(a, "cancel", 1))
        assert len(await keys(raw, prefix)) == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(await keys(raw, prefix)) == 1
    assert await keys(raw, prefix) == []


async def test_cancelled_while_creating_the_key_leaves_no_key(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    a = await make_client()
    b = await make_client()
    prefix = backend_of(a).keys.prefix("creating")
    async with a.lock("creating"):
        for spins in range(8):  # cut the attempt short at several points of its round trip
            task = asyncio.create_task(b.lock("creating").acquire())
            for _ in range(spins):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(await keys(raw, prefix)) == 1
    assert await keys(raw, prefix) == []


async def test_revoked_lease_is_lost_and_the_body_cancelled(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    client = await make_client(watchdog_ttl=3)
    backend = backend_of(client)
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock("revoked"):
            entered.set()
            await asyncio.sleep(HANG)

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), HANG)
    assert backend.session is not None
    assert raw.lease is not None
    lease = backend.session.lease
    await raw.lease.revoke(lease)
    with pytest.raises(aiodlock.LockLost):
        await asyncio.wait_for(task, HANG)
    # A fresh lease serves the next acquisition.
    async with client.lock("revoked") as again:
        assert backend.session.lease not in (0, lease)
        assert again.token > 0


async def test_configuration_errors() -> None:
    with pytest.raises(aiodlock.ConfigurationError, match="user name and a password"):
        aiodlock.connect("etcd://127.0.0.1:1?username=u")
    with pytest.raises(aiodlock.ConfigurationError, match="etcds"):
        aiodlock.connect("etcd://127.0.0.1:1?ssl_ca_certs=/x")
    with pytest.raises(aiodlock.ConfigurationError, match="no path"):
        aiodlock.connect("etcd://127.0.0.1:1/some/path")
    client = aiodlock.connect("etcd://alice:s3cret@127.0.0.1:1")
    assert "s3cret" not in repr(client)
    assert "alice:***@" in repr(client)


async def test_compaction_while_a_waiter_waits(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    a = await make_client()
    b = await make_client()
    await a.lock("compact").acquire()
    waiter = asyncio.create_task(b.lock("compact").acquire(timeout=HANG))
    await eventually(lambda: _waiting(a, "compact", 1))
    assert raw.kv is not None
    for i in range(5):  # history to compact away
        await raw.kv.put(f"/{a.config.namespace}/noise", str(i))
    revision = (await raw.kv.get("/")).header.revision
    await raw.kv.compact(revision, physical=True)
    await a.lock("compact").release()
    lease = await asyncio.wait_for(waiter, HANG)
    assert lease.token > 0


async def test_a_waiter_whose_lease_was_revoked_queues_again(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    a = await make_client()
    b = await make_client(watchdog_ttl=1)  # (its keep-alive finds the revocation in 1/3 s)
    backend = backend_of(b)
    prefix = backend.keys.prefix("requeue")
    await a.lock("requeue").acquire()
    held: list[bytes] = []

    async def wait() -> None:
        async with b.lock("requeue", timeout=HANG):
            held.extend(await keys(raw, prefix))

    waiter = asyncio.create_task(wait())
    await eventually(lambda: _waiting(a, "requeue", 1))
    assert backend.session is not None
    assert raw.lease is not None
    old = backend.session.lease
    await raw.lease.revoke(old)  # its key goes: the waiter must not take that for its turn
    await eventually(lambda: backend.session is not None and backend.session.lease not in (0, old))
    await eventually(lambda: _waiting(a, "requeue", 1), what="queued again on the new lease")
    assert not waiter.done()
    await a.lock("requeue").release()
    await asyncio.wait_for(waiter, HANG)
    [key] = held
    assert key == backend.keys.key(prefix, backend.session.lease)  # (the new lease's key)


async def test_a_client_uses_its_lease_key_again_and_a_slot_per_concurrent_waiter(
    make_client: ClientFactory, raw: Etcd3Client
) -> None:
    """A key made and deleted again and again costs the server nothing (a new key per
    acquisition would leave dead entries in its index for every read of the line): every
    acquisition of the client uses the same key, with a new create revision (the token);
    its tasks that wait at once each have a slot of their own."""
    client = await make_client()
    backend = backend_of(client)
    prefix = backend.keys.prefix("slots")
    assert backend.session is not None
    first = backend.keys.key(prefix, backend.session.lease)
    tokens = []
    for _ in range(3):
        async with client.lock("slots") as lease:
            assert await keys(raw, prefix) == [first]
            tokens.append(lease.token)
    assert tokens == sorted(set(tokens))
    other = await make_client()
    await other.lock("slots").acquire()
    seen: list[list[bytes]] = []

    async def wait() -> None:
        async with client.lock("slots", timeout=HANG):
            seen.append(await keys(raw, prefix))

    waiters = [asyncio.create_task(wait()) for _ in range(2)]
    await eventually(lambda: _waiting(other, "slots", 2))
    line = await keys(raw, prefix)
    assert sorted(line[1:]) == [first, backend.keys.key(prefix, backend.session.lease, 1)]
    await other.lock("slots").release()
    await asyncio.wait_for(asyncio.gather(*waiters), HANG)
    assert await keys(raw, prefix) == []
    async with client.lock("slots"):  # (both slots are free again: the first is taken)
        assert await keys(raw, prefix) == [first]
