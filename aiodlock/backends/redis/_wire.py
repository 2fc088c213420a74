"""The one transport of both Redis backends: pipelined connections (:class:`Link`, over a
:class:`Pipe`), the pub/sub connection too (:mod:`._pubsub`).  Replies and failures go to
callbacks in order, never raised."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import hiredis

from ..._errors import BackendTimeout, translating
from ..._types import monotonic
from ..._url import format_host
from ..._wakeup import Timer
from ._scripts import Script, memo

if TYPE_CHECKING:
    from ..._types import CommonConfig

log = logging.getLogger("aiodlock")
_EARLY: Final = object()


class ReplyError(Exception):
    """An error reply of a Redis server (``-ERR ...``, ``-NOSCRIPT ...``)."""


class NodeConnectionError(ConnectionError):
    """The connection to a server broke (or could not be made)."""


WIRE_ERRORS: Final = (ReplyError, ConnectionError, hiredis.ProtocolError)


def wire_error(
    label: str,
    exc: BaseException,
    what: str,
    secrets: tuple[str, ...] = (),
    transient: tuple[type[BaseException], ...] = (),
) -> BaseException:
    """``exc``, a failed request's outcome (a callback's error), as aiodlock reports it."""
    try:
        with translating(label, WIRE_ERRORS, what=what, secrets=secrets, transient=transient):
            raise exc
    except BaseException as mapped:
        return mapped


#: A request's callback: it gets the decoded reply or one of the errors above.
OnReply = Callable[[Any], None]
Arg = bytes | str | int
#: Per command of a write, the script it runs by EVALSHA (sent again with its source after
#: a NOSCRIPT answer) or None; None for all of them.
Calls = Sequence["ScriptCall | None"] | None


def _bulk(arg: Arg) -> bytes:
    data: bytes
    if isinstance(arg, bytes):
        data = arg
    elif isinstance(arg, str):
        data = arg.encode("utf-8", "surrogatepass")
    else:
        data = b"%d" % arg
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(*args: Arg) -> bytes:
    """One command in the Redis protocol (RESP)."""
    return b"*%d\r\n" % len(args) + b"".join([_bulk(arg) for arg in args])


def _eval_head(index: tuple[str, int, tuple[bytes, ...]]) -> bytes:
    """``EVALSHA sha numkeys keys...`` of a call with ``nargs`` arguments after them."""
    sha, nargs, keys = index
    head: tuple[Arg, ...] = (b"EVALSHA", sha, len(keys), *keys)
    return b"*%d\r\n" % (len(head) + nargs) + b"".join([_bulk(arg) for arg in head])


_HEADS: Final = memo(_eval_head)  # (a lock's calls repeat theirs)


class ScriptCall:
    """One run of a script, packed once however many servers it is sent to."""

    __slots__ = ("args", "data", "keys", "script")

    def __init__(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Arg], data: bytes = b""
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        #: ``EVALSHA sha numkeys keys... args...`` (packed here unless given)
        self.data = data or _HEADS((script.sha, len(args), tuple(keys))) + b"".join(
            map(_bulk, args)
        )

    def with_source(self) -> bytes:
        return pack(b"EVAL", self.script.source, len(self.keys), *self.keys, *self.args)


class CallTemplate:
    """Calls of one script that differ in ONE argument (a release's token): the rest is
    packed once."""

    __slots__ = ("_head", "_tail", "args", "keys", "script", "slot")

    def __init__(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Arg], slot: int
    ) -> None:
        self.script = script
        self.keys = tuple(keys)
        self.args = tuple(args)
        self.slot = slot
        self._head = _eval_head((script.sha, len(args), self.keys)) + b"".join(
            map(_bulk, args[:slot])
        )
        self._tail = b"".join(map(_bulk, args[slot + 1 :]))

    def fill(self, value: Arg) -> ScriptCall:
        args = (*self.args[: self.slot], value, *self.args[self.slot + 1 :])
        return ScriptCall(self.script, self.keys, args, self._head + _bulk(value) + self._tail)


def _settle(future: asyncio.Future[Any], reply: Any) -> None:
    if not future.done():
        future.set_result(reply)


def resolver(future: asyncio.Future[Any]) -> OnReply:
    """A callback that sets ``future``'s result to the reply (unless it is done)."""
    return functools.partial(_settle, future)  # (one Python call per reply, not two)


def collector(count: int, deliver: OnReply) -> list[OnReply]:
    """``count`` callbacks: once each got its reply, ``deliver`` gets the list of them (or
    the first failure among them)."""
    replies: list[Any] = [None] * count
    left = [count]

    def collect(index: int, reply: Any) -> None:
        replies[index] = reply
        left[0] -= 1
        if not left[0]:
            failed = [r for r in replies if isinstance(r, BaseException)]
            deliver(failed[0] if failed else replies)

    return [functools.partial(collect, index) for index in range(count)]


class Pipe(asyncio.Protocol):
    """The protocol side of one connection: replies are handed to callbacks in order.

    ONE timer per connection watches the oldest unanswered request: when it has waited
    ``op_timeout``, every request on the connection gets a :class:`~aiodlock.BackendTimeout`
    (no caller needs a timer of its own).  With ``on_push`` it is a pub/sub connection:
    replies no request waits for (messages) go there, ``last`` is when data last came and
    ``lost`` gets the error the connection ended with.
    """

    def __init__(self, label: str, op_timeout: float, on_push: OnReply | None) -> None:
        self.label = label
        self.op_timeout = op_timeout
        self.on_push = on_push
        self._timer = Timer(self._due)
        self.transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader(replyError=ReplyError)
        #: Per unanswered request, oldest first: its callback, its script and when it went.
        self._waiting: collections.deque[tuple[OnReply, ScriptCall | None, float]] = (
            collections.deque()
        )
        self.broken: BaseException | None = None  # why the connection is unusable
        self.last = monotonic()
        self.lost: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting, on_push = self._waiting, self.on_push
        if on_push is not None:
            self.last = monotonic()
        while waiting or on_push is not None:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self.close(NodeConnectionError(f"protocol error: {exc}"))
                return
            if reply is False:
                return
            if not waiting:
                on_push(reply)  # type: ignore[misc]  # (a pub/sub message)
                continue
            callback, call, _ = waiting.popleft()
            if call is not None and type(reply) is ReplyError and str(reply).startswith("NOSCRIPT"):
                # NOTE: NOSCRIPT means it did not run: send it again with its source (only
                # after a SCRIPT FLUSH: every connection loads the scripts first).
                self.send_one(call.with_source(), callback)
                continue
            try:
                callback(reply)
            except Exception:  # pragma: no cover - a bug in a callback must not desync us
                log.exception("aiodlock: a redis reply handler failed")

    def connection_lost(self, exc: BaseException | None) -> None:
        self._fail(NodeConnectionError(f"connection lost: {exc}" if exc else "connection closed"))

    def _due(self, now: float) -> float | None:
        oldest = self.oldest()
        if oldest is None or self.broken is not None:
            return None
        due = oldest + self.op_timeout
        if now < due:
            return due
        self.close(BackendTimeout(f"{self.label}: no answer within {self.op_timeout:g} s"))
        return None

    def _fail(self, error: BaseException) -> None:
        self._timer.cancel()
        if self.broken is None:
            self.broken = error
        waiting = [entry[0] for entry in self._waiting]
        self._waiting.clear()
        for callback in waiting:
            try:
                callback(self.broken)
            except Exception:  # pragma: no cover - see data_received
                log.exception("aiodlock: a redis reply handler failed")
        if not self.lost.done():
            self.lost.set_result(self.broken)

    def close(self, error: BaseException) -> None:
        """Give up on the connection: every unanswered request gets ``error``."""
        self._fail(error)
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes, callbacks: Sequence[OnReply], calls: Calls = None) -> None:
        """Write ``data`` (one or more commands); ``callbacks`` get the replies in order."""
        if self.broken is not None:
            for callback in callbacks:
                callback(self.broken)
            return
        now = monotonic()
        scripts = itertools.repeat(None) if calls is None else calls
        self._waiting.extend(zip(callbacks, scripts, itertools.repeat(now)))
        self._write(data, now)

    def send_one(self, data: bytes, callback: OnReply, call: ScriptCall | None = None) -> None:
        """:meth:`send` for one command (the hot path: no list).  ``call``: the command is
        that script's EVALSHA; a NOSCRIPT answer sends it again with the source."""
        if self.broken is not None:
            callback(self.broken)
            return
        now = monotonic()
        self._waiting.append((callback, call, now))
        self._write(data, now)

    def _write(self, data: bytes, now: float) -> None:
        if self._timer.handle is None:
            self._timer.at(now + self.op_timeout)  # (armed: for an older request, earlier)
        self.transport.write(data)  # type: ignore[union-attr]  # (set once connected)

    def oldest(self) -> float | None:
        return self._waiting[0][2] if self._waiting else None


@dataclasses.dataclass(frozen=True, slots=True)
class Address:
    """``host`` and ``port``, or a Unix socket ``path``; ``tls`` makes the SSL context (when
    connecting: a missing certificate fails the connection)."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    tls: Callable[[], ssl.SSLContext] | None = dataclasses.field(default=None, repr=False)

    def __str__(self) -> str:
        return self.path if self.path is not None else format_host(self.host, self.port)


#: Where a link connects: an address, or what finds it anew for every connection (the
#: master a Sentinel names, a Cluster node).
Target = Address | Callable[[], Awaitable[Address]]


def hello(
    username: str | None = None,
    password: str | None = None,
    db: int = 0,
    client_name: str | None = None,
    scripts: Sequence[Script] = (),
) -> list[bytes]:
    """A new connection's handshake: AUTH, CLIENT SETNAME, SELECT, SCRIPT LOAD."""
    commands: list[bytes] = []
    if password is not None:
        commands.append(pack(b"AUTH", *((username, password) if username else (password,))))
    if client_name:
        commands.append(pack(b"CLIENT", b"SETNAME", client_name))
    if db:
        commands.append(pack(b"SELECT", db))
    return commands + [pack(b"SCRIPT", b"LOAD", script.source) for script in scripts]


class Link:
    """ONE pipelined connection to one server, made (again) on demand: requests made
    meanwhile are sent, in order, once it is ready (an attempt's clean-up can never
    overtake the attempt; an unanswered request's reply is dropped when it comes).  Every
    new connection first sends the ``hello`` commands; ``on_hello`` gets their replies."""

    def __init__(
        self,
        label: str,
        address: Target,
        config: CommonConfig,
        *,
        hello: Sequence[bytes] = (),
        on_hello: Callable[[list[Any]], None] | None = None,
        on_push: OnReply | None = None,
    ) -> None:
        self.label = label
        self.address = address
        self.connect_timeout, self.op_timeout = config.connect_timeout, config.op_timeout
        self._hello = b"".join(hello)
        self._hellos = len(hello)
        self._on_hello = on_hello
        self.on_push = on_push
        #: The current connection's pipe (None before the first and after a broken one).
        self.pipe: Pipe | None = None
        self._connecting: asyncio.Task[Pipe] | None = None
        self.closed = False

    def __repr__(self) -> str:
        return f"<Link {self.label}>"

    def _usable(self) -> Pipe | None:
        # NOTE: a connection whose oldest request waited op_timeout is closed by the pipe's
        # own timer, so being open is enough.
        pipe = self.pipe
        if pipe is None:
            return None
        if pipe.broken is None and pipe.transport is not None and not pipe.transport.is_closing():
            return pipe
        self.pipe = None
        return None

    def send(self, data: bytes, callbacks: Sequence[OnReply], calls: Calls = None) -> None:
        """Write ``data``; ``callbacks`` get the replies (or the failure) in order."""
        pipe = self._usable()
        if pipe is not None:
            pipe.send(data, callbacks, calls)
            return
        if self.closed:
            error = NodeConnectionError("the connection is closed")
            for callback in callbacks:
                callback(error)
            return

        def send_when_ready(task: asyncio.Task[Pipe]) -> None:
            if task.cancelled():
                error: BaseException = NodeConnectionError("the connection attempt was cancelled")
            elif (exc := task.exception()) is not None:
                error = exc
            else:
                task.result().send(data, callbacks, calls)
                return
            for callback in callbacks:
                callback(error)

        self._connection().add_done_callback(send_when_ready)

    async def connect(self) -> Pipe:
        """The open connection, made now if there is none (raises if that fails)."""
        pipe = self._usable()
        if pipe is not None:
            return pipe
        if self.closed:
            raise NodeConnectionError("the connection is closed")
        return await asyncio.shield(self._connection())

    def _connection(self) -> asyncio.Task[Pipe]:
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(
                self._connect(), name=f"aiodlock:{self.label}:connect"
            )
        return self._connecting

    def call(self, data: bytes) -> asyncio.Future[Any]:
        """Send one packed command; the future gets its reply (or failure) as its result."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.send(data, (resolver(future),))
        return future

    async def _connect(self) -> Pipe:
        loop = asyncio.get_running_loop()
        pipe: Pipe | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                target = self.address
                address = target if isinstance(target, Address) else await target()
                protocol = functools.partial(Pipe, self.label, self.op_timeout, self.on_push)
                if address.path is not None:
                    _, pipe = await loop.create_unix_connection(protocol, address.path)
                else:
                    tls = None if address.tls is None else address.tls()
                    _, pipe = await loop.create_connection(
                        protocol,
                        address.host,
                        address.port,
                        ssl=tls,
                        ssl_handshake_timeout=None if tls is None else self.connect_timeout,
                    )
                if self._hellos:
                    await self._handshake(pipe)
        except BaseException as exc:
            if pipe is not None:
                pipe.close(NodeConnectionError("the connection attempt failed"))
            if isinstance(exc, TimeoutError):
                raise NodeConnectionError(
                    f"no connection within {self.connect_timeout:g} s"
                ) from exc
            raise
        finally:
            self._connecting = None
        # (in place before the requests that waited for it are sent, by the task's callbacks)
        self.pipe = pipe
        return pipe

    async def _handshake(self, pipe: Pipe) -> None:
        futures = [asyncio.get_running_loop().create_future() for _ in range(self._hellos)]
        pipe.send(self._hello, [resolver(f) for f in futures])
        replies = [await f for f in futures]
        for reply in replies:
            if isinstance(reply, BaseException):
                text = str(reply)
                if text.startswith(("WRONGPASS", "NOAUTH")) or "AUTH" in text:
                    raise ReplyError(
                        f"authentication failed, check the username and password: {text}"
                    )
                raise reply
        if self._on_hello is not None:
            self._on_hello(replies)

    def eval(self, call: ScriptCall, deliver: OnReply) -> None:
        """Run a script (EVALSHA; EVAL when the server lost it); ``deliver`` gets the reply."""
        # NOTE: only "not broken" is checked: a request written to a transport that is
        # closing is failed by the pipe when connection_lost comes (right after).
        pipe = self.pipe
        if pipe is not None and pipe.broken is None:
            pipe.send_one(call.data, deliver, call)  # (NOSCRIPT is handled by the pipe)
            return
        self.send(call.data, [deliver], [call])

    def eval_many(self, calls: Sequence[ScriptCall], deliver: OnReply) -> None:
        """Run scripts in one write; ``deliver`` gets the replies (or the first failure)."""
        self.send(b"".join(call.data for call in calls), collector(len(calls), deliver), calls)

    def eval_wait(self, call: ScriptCall, wait: bytes, deliver: OnReply) -> None:
        """``call`` and ``wait`` (a WAIT) in one write: ``deliver`` gets ``[reply, acks]``.

        NOTE: after a NOSCRIPT answer the pipe sends the script again behind the WAIT, which
        then measured nothing of it: the WAIT is sent again once the script answered.
        """
        got: list[Any] = []  # the script's answer, or _EARLY when the WAIT's came first

        def script(reply: Any) -> None:
            if not got:
                got.append(reply)
            elif isinstance(reply, BaseException):
                deliver(reply)
            else:
                got[0] = reply
                self.send(wait, [waited])

        def waited(reply: Any) -> None:
            if not got:
                got.append(_EARLY)
            else:
                first = got[0]
                deliver(first if isinstance(first, BaseException) else [first, reply])

        self.send(call.data + wait, [script, waited], [call, None])

    def drop(self, error: BaseException) -> None:
        """Close the current connection (the next request makes a new one)."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pipe.close(error)

    def close(self) -> None:
        self.closed = True
        task, self._connecting = self._connecting, None
        if task is not None:
            task.cancel()
        self.drop(NodeConnectionError("the connection was closed"))
