"""The ZooKeeper protocol against a real server: nodes, queue, watches, tokens, cleanup."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiozk import exc, protocol

import aiodlock
from aiodlock.backends.zookeeper import Disconnected, escape_segment, unescape_segment
from tests.servers import ZooKeeperServer

from .zk_helpers import (
    HANG,
    ClientFactory,
    RawFactory,
    RequestLogZooKeeper,
    backend_of,
    children,
    eventually,
    queue_length,
)

pytestmark = pytest.mark.zookeeper


async def test_node_layout_owner_and_czxid_token(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    client = await make_client()
    zk = await raw(zookeeper_server.address)
    backend = backend_of(client)
    async with client.lock("orders:42") as lease:
        parent = backend.lock_path("orders:42")
        assert parent == f"/{client.config.namespace}/locks/orders:42"
        [name] = await children(zk, parent)
        owner, attempt, seq = name.rsplit("#", 2)
        assert unescape_segment(owner) == lease.owner
        assert len(attempt) == 8
        assert seq.isdigit()
        _, stat = await zk.get(f"{parent}/{name}")
        assert lease.token == stat.created_zxid
        assert stat.ephemeral_owner == backend.session_id
        assert lease.expires_in is None  # the session is the lease
    assert await children(zk, parent) == []


@pytest.mark.parametrize(
    "name",
    ["a/b/c", "/", "..", " spaced out ", "nul\x00in\nname", "Ключ 鍵 🔒", "x" * 512, "🔒" * 512],
    ids=["slashes", "slash", "dotdot", "spaces", "control", "unicode", "512", "512-wide"],
)
async def test_any_name_is_one_node(
    make_client: ClientFactory,
    raw: RawFactory,
    zookeeper_server: ZooKeeperServer,
    name: str,
) -> None:
    a = await make_client()
    b = await make_client()
    zk = await raw(zookeeper_server.address)
    async with a.lock(name) as lease:
        assert await b.lock(name).try_acquire() is None
        status = await b.lock(name).status()
        assert status is not None
        assert status.owner == lease.owner
        assert status.name == name
        locks = f"/{a.config.namespace}/locks"
        assert await children(zk, locks) == [escape_segment(name)]
        # a name that differs only slightly is another lock
        variant = name[:-1] + ("Y" if name[-1] != "Y" else "y")
        other = await b.lock(variant).try_acquire()
        assert other is not None
        await b.lock(variant).release()
    assert await b.lock(name).try_acquire() is not None
    await b.lock(name).release()


async def test_status_reports_holder_token_and_waiters(make_client: ClientFactory) -> None:
    a = await make_client()
    b = await make_client()
    assert await b.lock("st").status() is None
    lease = await a.lock("st").acquire()
    waiters = [asyncio.create_task(b.lock("st").acquire()) for _ in range(3)]

    async def three_waiting() -> bool:
        status = await b.lock("st").status()
        return status is not None and status.waiters == 3

    await eventually(three_waiting)
    status = await b.lock("st").status()
    assert status is not None
    assert (status.owner, status.token, status.expires_in) == (lease.owner, lease.token, None)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await eventually(three_waiting_gone := _waiters_are(b, "st", 0))
    del three_waiting_gone
    await a.lock("st").release()
    assert await b.lock("st").status() is None


def _waiters_are(client: aiodlock.Client, name: str, count: int) -> Any:
    async def check() -> bool:
        status = await client.lock(name).status()
        return status is not None and status.waiters == count

    return check


async def test_fifo_order_and_increasing_tokens(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    clients = [await make_client() for _ in range(3)]
    zk = await raw(zookeeper_server.address)
    holder = clients[0]
    first = await holder.lock("fifo").acquire()
    granted: list[int] = []
    tokens: list[int] = []
    tasks = []
    for i in range(8):
        client = clients[i % 3]

        async def wait(i: int = i, client: aiodlock.Client = client) -> None:
            async with client.lock("fifo") as lease:
                granted.append(i)
                tokens.append(lease.token)

        tasks.append(asyncio.create_task(wait()))
        # the next one queues only once this one's node exists
        await eventually(lambda n=i + 2: _length_is(holder, zk, "fifo", n))
    await holder.lock("fifo").release()
    async with asyncio.timeout(HANG):
        await asyncio.gather(*tasks)
    assert granted == list(range(8))
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 8
    assert tokens[0] > first.token


async def _length_is(client: aiodlock.Client, zk: Any, name: str, n: int) -> bool:
    return await queue_length(client, zk, name) == n


@pytest.mark.parametrize("separate", [False, True], ids=["one-client", "client-per-waiter"])
async def test_release_wakes_only_the_next_waiter(
    logged_server: RequestLogZooKeeper,  # (first: its server outlives the clients' closing)
    make_client: ClientFactory,
    raw: RawFactory,
    separate: bool,
) -> None:
    """Each handoff fires exactly one watch, and at most one listing: no herd.

    Counted by the server: the requests of each session (its request log) and the
    watchers it notified of deleted nodes (mntr).
    """
    n = 12
    server = logged_server
    holder = await make_client(server.url)
    shared = await make_client(server.url)
    waiters = [await make_client(server.url) for _ in range(n)] if separate else [shared] * n
    sessions = [backend_of(c).session_id for c in waiters]
    parent = backend_of(holder).lock_path("herd")
    zk = await raw(server.address)

    def sent(kind: str) -> list[int]:
        """The waiters' creates, or listings of the lock: the session of each, in order."""
        return [
            r.session
            for r in server.requests(set(sessions))
            if r.kind == kind and (kind == "create2" or r.path == parent)
        ]

    # (the holder's own acquire is not counted: it made the lock's parent nodes too)
    await holder.lock("herd").acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        async with waiters[i].lock("herd"):
            order.append(i)
            await asyncio.sleep(0.005)

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(wait(i)))
        await eventually(lambda n=i + 2: _length_is(holder, zk, "herd", n))
    await eventually(lambda: len(sent("create2")) == n and len(sent("getChildren")) >= n)
    lists = len(sent("getChildren"))
    assert lists == n  # one create+list round trip each, nothing more
    notified = server.watch_notifications()
    await holder.lock("herd").release()
    async with asyncio.timeout(HANG):
        await asyncio.gather(*tasks)
    assert order == list(range(n))
    # One wake-up per handoff: a deleted node notifies its owner's own watch on it and
    # the next waiter's watch, nobody else (n + 1 nodes deleted, n handoffs).  With one
    # client for all waiters, a waiter's node and the next waiter are one session.
    notified = server.watch_notifications() - notified
    assert notified == ((n + 1) + n if separate else 2 + n)
    assert len(sent("create2")) == n
    relisted = sent("getChildren")[lists:]
    if separate:
        # The first waiter was right behind the holder; every later one lists once: n - 1
        # listings, and one handoff (the first waiter's) without a listing.
        assert sorted(relisted) == sorted(sessions[1:])
    else:
        # One client knows its own predecessors were holders: no listing at all.
        assert relisted == []


async def test_try_lock_on_a_taken_lock_creates_nothing(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    a = await make_client()
    b = await make_client()
    zk = await raw(zookeeper_server.address)
    await a.lock("try").acquire()
    parent = backend_of(a).lock_path("try")
    creates = await _child_changes(zk, parent)
    for _ in range(5):
        assert await b.lock("try").try_acquire() is None
    assert await _child_changes(zk, parent) == creates
    assert await queue_length(a, zk, "try") == 1
    await a.lock("try").release()
    lease = await b.lock("try").try_acquire()
    assert lease is not None
    await b.lock("try").release()


async def _child_changes(zk: Any, path: str) -> int:
    """The node's cversion: the server counts every create and delete of a child."""
    _, stat = await zk.get(path)
    version: int = stat.child_version
    return version


async def test_timeout_leaves_no_node(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    a = await make_client()
    b = await make_client()
    zk = await raw(zookeeper_server.address)
    await a.lock("to").acquire()
    with pytest.raises(aiodlock.LockTimeout):
        await b.lock("to").acquire(timeout=0.3)
    assert await queue_length(a, zk, "to") == 1
    await a.lock("to").release()
    assert await queue_length(a, zk, "to") == 0


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 4, 6, 10, 20])
async def test_cancel_while_creating_or_waiting_leaves_no_node(
    make_client: ClientFactory,
    raw: RawFactory,
    zookeeper_server: ZooKeeperServer,
    yields: int,
) -> None:
    a = await make_client()
    b = await make_client()
    zk = await raw(zookeeper_server.address)
    await a.lock("cx").acquire()
    task = asyncio.create_task(b.lock("cx").acquire())
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # checked directly in ZooKeeper, by another session
    assert await children(zk, backend_of(a).lock_path("cx")) != []
    assert await queue_length(a, zk, "cx") == 1
    await a.lock("cx").release()
    assert await queue_length(a, zk, "cx") == 0


async def test_cancel_while_the_create_is_in_flight(
    logged_server: RequestLogZooKeeper,
    make_client: ClientFactory,
    raw: RawFactory,
) -> None:
    """The server is paused with the create on the wire; the task is cancelled; the server
    then applies the create: abandon() still finds the node and deletes it."""
    server = logged_server
    client = await make_client(server.url, session_timeout=10, op_timeout=10)
    backend = backend_of(client)
    creates = _count_creates(backend)
    server.pause()
    try:
        task = asyncio.create_task(client.lock("inflight").acquire())
        await eventually(lambda: creates() == 1)
        task.cancel()
        await asyncio.sleep(0.2)
    finally:
        server.resume()
    with pytest.raises(asyncio.CancelledError):
        await task
    zk = await raw(server.address)
    assert await children(zk, backend.lock_path("inflight")) == []
    # its reply never reached the attempt: the session's one create is the one in flight
    # (the first create of a new lock fails, and then the attempt makes the lock node)
    sent = server.requests({backend.session_id})
    assert [r.kind for r in sent if r.kind in ("create2", "createContainer")] == ["create2"]
    async with client.lock("inflight"):
        pass


def _count_creates(backend: Any) -> Any:
    """How many requests the backend's session sent with a create (a wrapper of call())."""
    session = backend.session
    real_call = session.call
    sent = 0

    async def call(*requests: Any) -> list[Any]:
        nonlocal sent
        sent += any(isinstance(r, protocol.Create2Request) for r in requests)
        return await real_call(*requests)

    session.call = call
    return lambda: sent


def _drop_the_first_create(backend: Any) -> Any:
    """The connection dies right after the session's first create is sent (before its
    reply); afterwards, count the listings answered on their own (a create goes with its own)."""
    session = backend.session
    real_call = session.call
    dropped = False
    lookups = 0

    async def call(*requests: Any) -> list[Any]:
        nonlocal dropped, lookups
        if not dropped and any(isinstance(r, protocol.Create2Request) for r in requests):
            dropped = True
            sent = asyncio.ensure_future(real_call(*requests))  # the create goes out...
            await asyncio.sleep(0)
            session.conn.kill()  # ...and the connection dies before the reply
            await asyncio.gather(sent, return_exceptions=True)
            raise Disconnected()
        replies = await real_call(*requests)
        if dropped and [type(r) for r in requests] == [protocol.GetChildrenRequest]:
            lookups += 1
        return replies

    session.call = call
    return lambda: (dropped, lookups)


async def test_force_release_is_noticed_by_the_holder_at_once(
    make_client: ClientFactory,
) -> None:
    a = await make_client()
    admin = await make_client()
    started = asyncio.Event()
    body_cancelled = False

    async def hold() -> None:
        nonlocal body_cancelled
        async with a.lock("fr"):
            started.set()
            try:
                await asyncio.sleep(HANG)
            except asyncio.CancelledError:
                body_cancelled = True
                raise

    task = asyncio.create_task(hold())
    await started.wait()
    await asyncio.sleep(0.1)  # past the delay before the holder's own-node watch is set
    assert await admin.force_release("fr") is True
    with pytest.raises(aiodlock.LockLost, match="deleted"):
        async with asyncio.timeout(5):
            await task
    assert body_cancelled
    async with admin.lock("fr", timeout=5):
        pass


async def test_force_release_right_after_the_grant_is_noticed_too(
    make_client: ClientFactory,
) -> None:
    a = await make_client()
    admin = await make_client()
    lease = await a.lock("fr2", on_lost="ignore").acquire()
    assert await admin.force_release("fr2") is True  # before the own-node watch is set
    async with asyncio.timeout(5):
        await lease.wait_lost()
    with pytest.raises(aiodlock.LockLost):
        await a.lock("fr2").extend()
    assert await admin.force_release("fr2") is False


async def test_extend_checks_the_node(make_client: ClientFactory) -> None:
    a = await make_client()
    lock = a.lock("ext")
    async with lock as lease:
        await lock.extend()
        assert lease.expires_in is None
        assert not lease.lost


async def test_fixed_ttl_is_enforced_by_the_core(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    a = await make_client()
    b = await make_client()
    zk = await raw(zookeeper_server.address)
    lease = await a.lock("ttl", ttl=0.5, on_lost="ignore").acquire()
    assert lease.expires_in is not None
    assert 0 < lease.expires_in <= 0.5
    await a.lock("ttl").extend(ttl=0.6)
    assert lease.expires_in is not None
    assert 0 < lease.expires_in <= 0.6
    async with asyncio.timeout(5):
        await lease.wait_lost()
    assert "ttl" in (lease.lost_reason or "")
    await eventually(lambda: _length_is(a, zk, "ttl", 0))
    async with b.lock("ttl", timeout=5):
        pass
    await a.lock("ttl").release()  # on_lost="ignore": no LockLost


async def test_tokens_keep_increasing_when_the_lock_node_is_recreated(
    fast_container_server: ZooKeeperServer,
    make_client: ClientFactory,
    raw: RawFactory,
) -> None:
    """Sequence numbers restart when the container is reaped; the czxid token does not."""
    client = await make_client(fast_container_server.url)
    zk = await raw(fast_container_server.address)
    backend = backend_of(client)
    parent = backend.lock_path("rec")
    tokens = []
    for _ in range(2):
        async with client.lock("rec") as lease:
            [name] = await children(zk, parent)
            assert name.endswith("#0000000000")  # a fresh lock node each time
            tokens.append(lease.token)
        await eventually(lambda: _absent(zk, parent))
    assert tokens[1] > tokens[0]


async def _absent(zk: Any, path: str) -> bool:
    return not await zk.exists(path)


async def test_lock_nodes_do_not_accumulate(
    fast_container_server: ZooKeeperServer,
    make_client: ClientFactory,
    raw: RawFactory,
) -> None:
    client = await make_client(fast_container_server.url)
    zk = await raw(fast_container_server.address)
    locks = f"/{client.config.namespace}/locks"
    for i in range(20):
        async with client.lock(f"many/{i}"):
            pass
    # container nodes: the server deletes each once its last child is gone
    await eventually(lambda: _no_children(zk, locks))


async def _no_children(zk: Any, path: str) -> bool:
    return await children(zk, path) == []


async def test_protection_mode_finds_the_node_of_a_lost_create_reply(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    """The connection drops right after the create is sent: after reconnecting, the
    client finds its node by the owner/attempt in its name instead of making another."""
    client = await make_client()
    zk = await raw(zookeeper_server.address)
    backend = backend_of(client)
    dropped_and_lookups = _drop_the_first_create(backend)
    session_id = backend.session_id
    async with asyncio.timeout(HANG):
        lease = await client.lock("prot").acquire()
    dropped, lookups = dropped_and_lookups()
    assert dropped
    assert backend.session_id == session_id  # same session, resumed
    assert lookups == 1  # the protection-mode lookup for the node of the lost reply
    parent = backend.lock_path("prot")
    [name] = await children(zk, parent)  # one node, not two
    _, stat = await zk.get(f"{parent}/{name}")
    assert lease.token == stat.created_zxid
    await client.lock("prot").release()
    assert await children(zk, parent) == []


async def test_a_late_node_of_an_attempt_with_a_lost_create_is_swept(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    """A create whose reply was lost may be applied after protection mode looked (through
    another member): the stray node of that attempt must not keep the lock once we leave."""
    a = await make_client()
    b = await make_client()
    zk = await raw(zookeeper_server.address)
    backend = backend_of(b)
    await a.lock("late").acquire()
    dropped_and_lookups = _drop_the_first_create(backend)  # the waiter's create reply is lost
    waiter = asyncio.create_task(_take_and_release_later(b, "late"))
    await eventually(lambda: _length_is(a, zk, "late", 2))
    # the waiter found its node and listed the queue again: it is waiting behind ``a``
    await eventually(lambda: dropped_and_lookups() == (True, 2))
    parent = backend.lock_path("late")
    mine = next(n for n in await children(zk, parent) if n.startswith(escape_segment(b.id)))
    # the late create, behind the waiter's node, with the attempt's own name prefix
    await zk.create(f"{parent}/{mine[: mine.rindex('#') + 1]}", ephemeral=True, sequential=True)
    assert await queue_length(a, zk, "late") == 3
    await a.lock("late").release()
    async with asyncio.timeout(HANG):
        await waiter
    assert await children(zk, parent) == []


async def _take_and_release_later(client: aiodlock.Client, name: str) -> None:
    async with client.lock(name):
        pass


async def test_close_deletes_the_sessions_nodes_at_once(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    a = await make_client()
    zk = await raw(zookeeper_server.address)
    await a.lock("closing").acquire()
    waiter = asyncio.create_task(a.lock("closing").acquire())
    await eventually(lambda: _length_is(a, zk, "closing", 2))
    parent = backend_of(a).lock_path("closing")
    await a.close()
    try:
        lease = await waiter
    except (asyncio.CancelledError, aiodlock.LockError):
        pass
    else:  # handed the lock while the client closed: then it is lost at once
        assert lease.lost
    assert await children(zk, parent) == []


async def test_acl_and_digest_auth(
    make_client: ClientFactory, raw: RawFactory, zookeeper_server: ZooKeeperServer
) -> None:
    host = zookeeper_server.address
    owner = await make_client(f"zookeeper://alice:wonder@{host}/secure", acl="creator_read")
    same_user = await make_client(f"zk://alice:wonder@{host}/secure", acl="creator_read")
    stranger = await make_client(f"zookeeper://{host}/secure")
    zk = await raw(host)
    lease = await owner.lock("acl").acquire()
    parent = backend_of(owner).lock_path("acl")
    assert parent.startswith("/secure/")
    acl = await zk.get_acl(parent)
    assert {(a.id.scheme, a.id.id.split(":")[0]) for a in acl} == {
        ("digest", "alice"),
        ("world", "anyone"),
    }
    status = await stranger.lock("acl").status()  # anyone may read
    assert status is not None
    assert status.owner == lease.owner
    with pytest.raises(aiodlock.BackendError, match="NoAuth"):
        await stranger.force_release("acl")  # but not delete
    assert await stranger.lock("acl").try_acquire() is None  # looks, creates nothing
    with pytest.raises(aiodlock.BackendError, match="NoAuth"):
        await stranger.lock("acl").acquire(timeout=5)  # may not queue
    assert await same_user.force_release("acl") is True
    async with asyncio.timeout(5):
        await lease.wait_lost()
    with pytest.raises(exc.NoAuth):
        await zk.create(f"{parent}/intruder")
