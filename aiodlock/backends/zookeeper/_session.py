"""ONE ZooKeeper session over a succession of aiozk connections (aiozk's own session
resends a create, notices a dead server late, ...: docs/backends/zookeeper.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from aiozk import exc, protocol
from aiozk.connection import Connection

from ..._types import CommonConfig, monotonic
from ..._wakeup import Backoff

log = logging.getLogger("aiodlock.zookeeper")

OP_CREATE_CONTAINER = 19  # (aiozk has no request for it; the reply is a create2 reply)
#: opcode -> reply type: aiozk's table, and createContainer's (aiozk's table is left alone).
_REPLY_TYPES = {**protocol.response_xref, OP_CREATE_CONTAINER: protocol.Create2Response}
EVENT_DELETED: int = protocol.WatchEvent.DELETED
#: Bytes of paths per SetWatches request: one packet stays far below jute.maxbuffer.
SET_WATCHES_CHUNK = 128 * 1024
#: xid, zxid, error code: the header of every reply.
_REPLY_HEADER = struct.Struct("!iqi")


class CreateContainerRequest(protocol.Create2Request):  # type: ignore[misc]
    """``createContainer``: a node the server deletes once its last child is gone."""

    opcode = OP_CREATE_CONTAINER


class Disconnected(exc.ZKError):  # type: ignore[misc]
    """The request could not be sent, or its reply was lost: a write may have been applied."""

    def __str__(self) -> str:
        return "the connection to ZooKeeper was lost (the request's outcome is unknown)"


#: ``(session_id, lost)``: a session established or resumed (``lost`` None), or whatever it
#: held is lost (``lost`` says why: it expired, or may have: nothing heard for its timeout).
EventCallback = Callable[[int, str | None], None]
#: Called with the event type (deleted / data changed) when a data watch fires.
WatchCallback = Callable[[int], None]


def _consume(fut: asyncio.Future[Any]) -> None:  # (or asyncio logs it as never retrieved)
    if not fut.cancelled():
        fut.exception()


def _hex(session_id: int) -> str:
    return f"0x{session_id & 0xFFFFFFFFFFFFFFFF:x}"


class _Connection(Connection):  # type: ignore[misc]
    """aiozk's connection (kept: the connect handshake) with our bookkeeping of requests,
    batched writes, reply timing and a reader that notices the connection's death at once."""

    def __init__(self, host: str, port: int, session: Session) -> None:
        super().__init__(host, port, session._dispatch, session.op_timeout)
        self.session = session
        self.last_received = self.last_sent = monotonic()
        #: xid -> (future, reply type, send time) of each request in flight, oldest first (a
        #: special xid, e.g. a ping's or an auth's, may have several).
        self.waiting: dict[int, list[tuple[asyncio.Future[Any], Any, float]]] = {}

    def send_batch(self, requests: Iterable[Any]) -> list[asyncio.Future[Any]]:
        """Send ``requests`` in ONE write (one system call, one TCP segment)."""
        loop = asyncio.get_running_loop()
        now = monotonic()
        futures: list[asyncio.Future[Any]] = []
        chunks: list[bytes] = []
        for request in requests:
            fut: asyncio.Future[Any] = loop.create_future()
            fut.add_done_callback(_consume)
            futures.append(fut)
            if self.closing:
                fut.set_exception(exc.ConnectError(self.host, self.port))
                continue
            xid = request.special_xid or self.session.next_xid()  # a ping's, an auth's, or the next
            payload = request.serialize(xid)
            chunks.append(len(payload).to_bytes(4, "big") + payload)
            # An auth reply does not tell that the server restarted the session's timer.
            sent = 0.0 if xid == protocol.AUTH_XID else now
            self.waiting.setdefault(xid, []).append((fut, _REPLY_TYPES[request.opcode], sent))
        if chunks:
            self.last_sent = now
            try:
                self.writer.write(b"".join(chunks))
            except Exception:
                log.debug("zookeeper: write failed", exc_info=True)
                self.kill()
        return futures

    async def read_body(self) -> bytes:
        """One reply, without its length.  (aiozk's reader starts two tasks per reply, a
        ``wait_for`` around each read; a silent server is caught by the session instead.)"""
        try:
            size = int.from_bytes(await self.reader.readexactly(4), "big", signed=True)
            body: bytes = await self.reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise ConnectionAbortedError from None
        self.last_received = monotonic()
        return body

    async def read_loop(self) -> None:
        """Hand each reply to its request's future, each event to the session."""
        try:
            while not self.closing:
                body = await self.read_body()
                xid, zxid, error = _REPLY_HEADER.unpack_from(body)
                body = body[_REPLY_HEADER.size :]
                if xid == protocol.WATCH_XID:
                    self.watch_handler(protocol.WatchEvent.deserialize(body))
                    continue
                waiting = self.waiting.get(xid)
                if not waiting:
                    raise exc.ZKError(f"reply to an unknown request (xid {xid})")
                fut, reply_type, sent = waiting.pop(0)
                if not waiting:
                    del self.waiting[xid]
                self.session.confirmed_at = max(self.session.confirmed_at, sent)
                if fut.done():
                    continue
                if error:
                    fut.set_exception(exc.get_response_error(error))
                else:
                    fut.set_result((zxid, reply_type.deserialize(body)))
        except ConnectionAbortedError:
            pass  # the server closed the connection
        except Exception:
            log.debug("zookeeper: reading from %s:%s failed", self.host, self.port, exc_info=True)
        finally:
            self.kill()

    def kill(self) -> None:
        """Drop the connection now; pending requests fail with ConnectError."""
        self.closing = True
        waiting, self.waiting = self.waiting, {}
        for fut, _, _ in (entry for entries in waiting.values() for entry in entries):
            if not fut.done():
                fut.set_exception(exc.ConnectError(self.host, self.port))
        task = self.read_loop_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()


class Session:
    """ONE ZooKeeper session: connects to the hosts in random order, resumes the session
    after a connection loss (if the server still has it), pings when idle for a third of
    the session timeout, drops a connection silent for two thirds of it, and reports a new
    or resumed session, and a lost one, to ``on_event``."""

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        timeout: float,
        config: CommonConfig,
        auth: Sequence[tuple[str, bytes]],
        on_event: EventCallback,
    ) -> None:
        self.hosts = list(hosts)
        #: The requested session timeout, replaced by the one the server negotiated.
        self.timeout = timeout
        self.connect_timeout = config.connect_timeout
        self.op_timeout = config.op_timeout
        self.auth = list(auth)
        self.on_event = on_event
        self.session_id = 0
        self.password = b"\x00" * 16
        self.last_zxid = 0
        self.conn: _Connection | None = None  # the connection with an established session
        self.closing = False
        self.presumed_dead = False  # presumed expired, until the server confirms it
        self.watches: dict[str, set[WatchCallback]] = {}  # path -> data watch callbacks
        self._xid = 0
        #: Send time of the latest request the server answered: the session lives on the
        #: server at least until ``confirmed_at + timeout`` (it restarted its timer after).
        self.confirmed_at = 0.0
        self._state_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="aiodlock:zookeeper-session")
        await self.wait_connected(None)

    async def close(self) -> None:
        """End the session on the server (its ephemeral nodes go at once) and disconnect."""
        if self.closing:
            return
        self.closing = True
        self._set_expiry_timer(None)
        if self.connected:
            # The server answers, then hangs up; either ends the request (kill() fails it).
            await asyncio.wait(self.send(protocol.CloseRequest()), timeout=self.op_timeout)
        conn, self.conn = self.conn, None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if conn is not None:
            conn.kill()
        self._wake()

    @property
    def connected(self) -> bool:
        """A session is established on a live connection (requests can be sent)."""
        # A killed connection counts as down at once, before the session task has run: a
        # retry loop that sees "connected" must never spin on Disconnected.
        return self.conn is not None and not self.conn.closing

    def usable(self, session_id: int) -> bool:
        """Is ``session_id`` the current session, not presumed expired?"""
        return session_id != 0 and session_id == self.session_id and not self.presumed_dead

    def _wake(self) -> None:
        self._state_changed.set()
        self._state_changed = asyncio.Event()

    def _emit(self, session_id: int, lost: str | None = None) -> None:
        self._wake()
        try:
            self.on_event(session_id, lost)
        except Exception:  # pragma: no cover - the handler is ours and must not raise
            log.exception("zookeeper: the session event handler failed")

    async def wait_connected(self, until: float | None) -> bool:
        """Wait until connected (True), or until ``until`` (monotonic) passes (False)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if until is None else until - monotonic()):
                while not self.connected and not self.closing:
                    await self._state_changed.wait()
        return self.connected

    def _set_expiry_timer(self, delay: float | None) -> None:
        """Cancel the presumed-expiry timer and, given ``delay``, set it again."""
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()  # (a no-op once it ran)
        if delay is not None and self.session_id and not self.presumed_dead:
            self._expiry_timer = asyncio.get_running_loop().call_later(
                max(0.0, delay), self._presume_expired, self.session_id
            )

    def _presume_expired(self, session_id: int) -> None:
        if self.conn is not None or session_id != self.session_id or self.closing:
            return
        self.presumed_dead = True
        lost = (
            f"no contact with ZooKeeper for the session timeout ({self.timeout:g} s): "
            f"the session, and the lock with it, may have expired"
        )
        log.warning("zookeeper: session %s: %s", _hex(session_id), lost)
        self._emit(session_id, lost)

    async def _run(self) -> None:
        """Connect, serve the connection until it dies, again, with the core's backoff
        (50 ms to 1 s, jittered) between rounds over the servers."""
        backoff = Backoff(first=0.05, cap=1.0)
        while not self.closing:
            if conn := await self._connect_any():
                backoff.reset()
                await self._serve(conn)
            else:
                await asyncio.sleep(backoff.next())

    async def _connect_any(self) -> _Connection | None:
        """One round over the hosts: a connection with an established session, or None."""
        hosts = random.sample(self.hosts, len(self.hosts))
        per_host = min(self.connect_timeout, max(0.5, self.timeout / len(hosts)))
        for host, port in hosts:
            for _ in range(2):  # a second try at once when the session had expired
                conn = _Connection(host, port, self)
                outcome = "failed"
                try:
                    async with asyncio.timeout(per_host):
                        await conn.connect()
                        if not conn.start_read_only:  # (a read-only server is passed over)
                            outcome = await self._establish(conn)
                except exc.ResponseError as error:  # e.g. AuthFailed
                    log.warning("zookeeper: %s:%s refused the session: %s", host, port, error)
                except Exception as error:
                    log.debug("zookeeper: no session on %s:%s: %r", host, port, error)
                finally:
                    if outcome != "ok":
                        conn.kill()
                if outcome == "ok":
                    return conn
                if outcome != "expired":
                    break
        if self.session_id and monotonic() > self.confirmed_at + 2 * self.timeout:
            # The old session cannot exist any more (were the servers wiped?): forget the
            # last zxid so that a server with a shorter history accepts us.
            self.last_zxid = 0
        return None

    async def _establish(self, conn: _Connection) -> str:
        """Establish or resume the session on ``conn``: "ok", or "expired" (raises else)."""
        sent = monotonic()
        request = protocol.ConnectRequest(
            protocol_version=0,
            last_seen_zxid=self.last_zxid,
            timeout=int(self.timeout * 1000),
            session_id=self.session_id,
            password=self.password,
            read_only=False,
        )
        payload = request.serialize()
        conn.writer.write(len(payload).to_bytes(4, "big") + payload)
        response = protocol.ConnectResponse.deserialize(await conn.read_body())
        old = self.session_id
        if response.session_id == 0:
            # The server no longer knows the session: its ephemeral nodes are gone.
            self.session_id = 0
            self.password = b"\x00" * 16
            self._set_expiry_timer(None)
            if old:
                log.warning("zookeeper: session %s expired", _hex(old))
                self._emit(old, "the ZooKeeper session expired (its lock nodes were deleted)")
            return "expired"
        self.session_id = response.session_id
        self.password = response.password
        self.timeout = response.timeout / 1000
        self.confirmed_at = sent
        conn.start_read_loop()
        auths = [protocol.AuthRequest(type=0, scheme=s, auth=c) for s, c in self.auth]
        await asyncio.gather(*conn.send_batch(auths))
        self.conn = conn
        self._set_expiry_timer(None)
        self.presumed_dead = False
        log.debug(
            "zookeeper: %s session %s on %s:%s (timeout %g s)",
            "resumed" if old == self.session_id else "new",
            _hex(self.session_id),
            conn.host,
            conn.port,
            self.timeout,
        )
        self._resend_watches(conn)
        self._emit(self.session_id)
        return "ok"

    async def _serve(self, conn: _Connection) -> None:
        """Keep ``conn`` alive with pings until it dies (its reader's task ends)."""
        tick = max(0.02, self.timeout / 12)
        try:
            while not (await asyncio.wait({conn.read_loop_task}, timeout=tick))[0]:
                now = monotonic()
                silent = now - conn.last_received
                if silent >= self.timeout * 2 / 3:
                    log.info(
                        "zookeeper: nothing received from %s:%s for %.2f s; reconnecting",
                        conn.host,
                        conn.port,
                        silent,
                    )
                    break
                idle = max(silent, now - conn.last_sent) >= self.timeout / 3
                if idle and protocol.PING_XID not in conn.waiting:
                    conn.send_batch([protocol.PingRequest()])
        finally:
            conn.kill()
            if self.conn is conn:
                self.conn = None
                self._wake()
                if not self.closing:
                    self._set_expiry_timer(self.confirmed_at + self.timeout - monotonic())

    def next_xid(self) -> int:
        self._xid = self._xid + 1 if self._xid < 0x7FFFFFFF else 1
        return self._xid

    def send(self, *requests: Any) -> list[asyncio.Future[Any]]:
        """Send without waiting; the replies go to the futures."""
        if not self.connected:
            raise Disconnected()
        assert self.conn is not None
        return self.conn.send_batch(requests)

    async def call(self, *requests: Any) -> list[Any]:
        """Send ``requests`` in one round trip; their replies (a refusal: its ResponseError),
        or :class:`Disconnected`.  The server runs them in order: a read sees an earlier write."""
        results: list[Any] = []
        for fut in self.send(*requests):
            try:
                zxid, response = await fut
                self.last_zxid = max(self.last_zxid, zxid)
            except exc.ConnectError:
                raise Disconnected() from None
            except exc.ResponseError as error:
                response = error
            results.append(response)
        return results

    def watch(self, path: str, callback: WatchCallback) -> None:
        """Call ``callback(event_type)`` when a data watch on ``path`` fires."""
        self.watches.setdefault(path, set()).add(callback)

    def unwatch(self, path: str, callback: WatchCallback) -> None:
        callbacks = self.watches.get(path, set())
        callbacks.discard(callback)
        if not callbacks:
            self.watches.pop(path, None)

    def _dispatch(self, event: Any) -> None:
        if event.type in (EVENT_DELETED, protocol.WatchEvent.DATA_CHANGED):  # the only watches set
            loop = asyncio.get_running_loop()
            for callback in list(self.watches.get(event.path, ())):
                loop.call_soon(callback, event.type)

    def _resend_watches(self, conn: _Connection) -> None:
        """Set every data watch again after a reconnect (it fires if the node changed)."""
        chunks: list[list[str]] = []
        size = SET_WATCHES_CHUNK
        for path in sorted(self.watches):
            length = len(path.encode("utf-8", "surrogatepass")) + 4
            if size + length > SET_WATCHES_CHUNK:
                chunks.append([])
                size = 0
            chunks[-1].append(path)
            size += length
        conn.send_batch(
            protocol.SetWatchesRequest(
                relative_zxid=self.last_zxid, data_watches=chunk, exist_watches=[], child_watches=[]
            )
            for chunk in chunks
        )
