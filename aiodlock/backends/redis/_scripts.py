"""The Redis lock protocol: key layout and the Lua scripts, shared by ``redis`` and ``redlock``.

One lock name's keys (one hash tag: one Cluster slot, so one script may touch them all)::

    {ns}:{<name>}             hash    {owner: token}   the holder, with a millisecond expiry
    {ns}:{<name>}:token       string  fencing counter, INCR'd once per new grant (never expires)
    {ns}:{<name>}:line        zset    the line: fair (and urgent) waiters by rank (the server's
                                      time in µs when they joined, or the client's time when
                                      they started waiting: Redlock's, the same on every node)
    {ns}:{<name>}:deadlines   zset    the line: owner -> server time (ms) its place lapses
    {ns}:{<name>}:released    channel a release/expiry of the lock is announced here
    {ns}:{<name>}:released:<owner>    the line: the next waiter's own channel

``<name>`` is the name in UTF-8 with ``%``, ``{`` and ``}`` percent-escaped: any name gives
exactly one hash tag, distinct names distinct keys.  As Redisson's RLock and RFairLock, but
the hash field holds the hold's fencing token, not a reentrancy count (the client counts
reentrant acquires): a retried attempt is idempotent and ``status()`` reports the token.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """A Lua script with its SHA1 (run with EVALSHA; on NOSCRIPT, with EVAL)."""

    name: str
    source: str
    sha: str


def escape_name(name: str) -> bytes:
    """The name inside the hash tag: UTF-8 (lone surrogates kept), ``% { }`` escaped."""
    raw = name.encode("utf-8", "surrogatepass")
    return raw.replace(b"%", b"%25").replace(b"{", b"%7B").replace(b"}", b"%7D")


class LockKeys:
    """Every key and channel of one lock name (bytes, ready to be sent)."""

    def __init__(self, namespace: str, name: str) -> None:
        self.name = name
        self.lock = base = namespace.encode() + b":{" + escape_name(name) + b"}"
        self.counter = base + b":token"
        self.queue = base + b":line"
        self.deadlines = base + b":deadlines"
        self.channel = base + b":released"
        self.waiter_prefix = base + b":released:"
        #: The KEYS of the scripts that touch the line, and of those that may also grant.
        self.line = (self.lock, self.queue, self.deadlines)
        self.every = (self.lock, self.counter, self.queue, self.deadlines)

    def waiter_channel(self, owner: str) -> bytes:
        """The channel a fair waiter listens on for its own turn."""
        return self.waiter_prefix + owner.encode("utf-8", "surrogatepass")

    def __repr__(self) -> str:
        return f"<LockKeys {self.lock!r}>"


def memo(make: Callable[[K], V], limit: int = 4096) -> Callable[[K], V]:
    """``make(key)``, made once per key (of the ``limit`` last used)."""
    return functools.lru_cache(maxsize=limit)(make)


def key_table(namespace: str) -> Callable[[str], LockKeys]:
    """:class:`LockKeys` by name for one namespace (a lock's calls repeat them)."""
    return memo(functools.partial(LockKeys, namespace))


# -- shared Lua fragments ---------------------------------------------------------------------

# now_ms(): the server clock.  purge(queue, deadlines, now): drop the lapsed waiters at the
# head of the line (their process died or stopped retrying); the first live one, or false.
# first(queue): the member of the lowest rank, or nil.
_NOW = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""
_PURGE = """
local function first(queue)
  return redis.call('ZRANGE', queue, 0, 0)[1]
end
local function purge(queue, deadlines, now)
  while true do
    local head = first(queue)
    if not head then return false end
    local deadline = redis.call('ZSCORE', deadlines, head)
    if deadline and tonumber(deadline) > now then return head end
    redis.call('ZREM', queue, head)
    redis.call('ZREM', deadlines, head)
  end
end
"""

# call_next(head, ...): the lock is free for the first in line: a fair waiter hears it on
# its own channel, an urgent one (marked '!' .. owner) by name on the name's channel (no
# other waiter there is woken: none may take the lock).  notify(...): the lock is free:
# call the first live waiter in line, or announce it on the name's channel.
_NOTIFY = (
    _NOW
    + _PURGE
    + """
local function call_next(head, channel, prefix)
  if string.byte(head, 1) == 33 then
    redis.call('PUBLISH', channel, string.sub(head, 2))
  else
    redis.call('PUBLISH', prefix .. head, 'next')
  end
end
local function notify(queue, deadlines, channel, prefix)
  if redis.call('EXISTS', queue) == 1 then
    local head = purge(queue, deadlines, now_ms())
    if head then
      call_next(head, channel, prefix)
      return
    end
  end
  redis.call('PUBLISH', channel, 'released')
end
"""
)

# others_first(queue, deadlines, member): the first live waiter and the server time when
# it is not ``member``, else false (``member`` first in line leaves the line).
_LINE = """
local function others_first(queue, deadlines, member)
  if redis.call('EXISTS', queue) == 0 then return false end
  local now = now_ms()
  local head = purge(queue, deadlines, now)
  if head and head ~= member then return head, now end
  if head then
    redis.call('ZREM', queue, head)
    redis.call('ZREM', deadlines, head)
  end
  return false
end
"""


def _script(name: str, helpers: str, text: str) -> Script:
    """A script with its header comment (the text's leading ``--`` lines) first."""
    lines = text.strip("\n").split("\n")
    split = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    source = "\n".join([*lines[:split], helpers.strip(), *lines[split:], ""]).replace("\n\n", "\n")
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


# -- the scripts: KEYS, ARGV and the reply of each in its header -------------------------------

ACQUIRE = _script(
    "acquire",
    _NOW + _PURGE + _LINE,
    """
-- Take a free lock, unless owners wait in line (fair or urgent): then only the first may.
-- KEYS[1] lock hash   KEYS[2] fencing counter   KEYS[3] queue   KEYS[4] deadlines
-- ARGV[1] owner       ARGV[2] lease ms
-- returns token (>= 1) granted, or already held by ARGV[1] (lease refreshed: idempotent);
--   -1 - ms: held (ms left on its lease) or kept for the first in line (ms until its place
--   lapses); 0: held with no expiry.  (An integer, not a table: cheaper for the server.)
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head, now = others_first(KEYS[3], KEYS[4], '!' .. ARGV[1])
  if head then return -1 - math.max(0, tonumber(redis.call('ZSCORE', KEYS[4], head)) - now) end
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], ARGV[1], token)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return token
end
local token = redis.call('HGET', KEYS[1], ARGV[1])
if token then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(token)
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return 0 end
return -1 - pttl
""",
)

ACQUIRE_FAIR = _script(
    "acquire_fair",
    _NOW + _PURGE,
    """
-- Take a lock in request order (Redisson RFairLock style).
-- KEYS[1] lock hash   KEYS[2] fencing counter   KEYS[3] queue   KEYS[4] deadlines
-- ARGV[1] owner   ARGV[2] lease ms   ARGV[3] ms a queued owner keeps its place unasked
-- ARGV[4] '1': queue up when not granted, '0': a try-lock (leaves nothing behind)
-- ARGV[5] '1': an urgent non-fair waiter (its place is '!' .. owner), '0': a fair one
-- ARGV[6] its rank in line (µs; lower first): '' = the server's time now (Redlock gives the
--   same on every node)
-- returns token (>= 1) granted (or already held by ARGV[1], lease refreshed); -1 - ms:
--   not granted, ms until something may change unannounced; 0: no such time known
local owner = ARGV[1]
local member = owner
if ARGV[5] == '1' then member = '!' .. owner end
local token = redis.call('HGET', KEYS[1], owner)
if token then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(token)
end
local now = now_ms()
local waiter_ms = tonumber(ARGV[3])
if ARGV[4] == '1' then
  -- Take a place first (a new member its rank, which may be ahead of the others; a queued
  -- one keeps its place, with a new deadline): the first in line takes a free lock.
  local rank = ARGV[6]
  if rank == '' then
    local t = redis.call('TIME')
    rank = t[1] .. string.format('%06d', tonumber(t[2]))
  end
  redis.call('ZADD', KEYS[4], now + waiter_ms, member)
  redis.call('ZADD', KEYS[3], 'NX', rank, member)
  redis.call('PEXPIRE', KEYS[3], waiter_ms)
  redis.call('PEXPIRE', KEYS[4], waiter_ms)
end
local head = purge(KEYS[3], KEYS[4], now)
local free = redis.call('EXISTS', KEYS[1]) == 0
if free and (not head or head == member) then
  if head then
    redis.call('ZREM', KEYS[3], member)
    redis.call('ZREM', KEYS[4], member)
  end
  token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], owner, token)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return token
end
local retry = -1
local function consider(ms)
  if ms >= 0 and (retry < 0 or ms < retry) then retry = ms end
end
if not free then consider(redis.call('PTTL', KEYS[1])) end
if head and head ~= member then consider(tonumber(redis.call('ZSCORE', KEYS[4], head)) - now) end
if ARGV[4] == '1' then consider(math.floor(waiter_ms / 3)) end
if retry < 0 then return 0 end
return -1 - retry
""",
)

RENEW = _script(
    "renew",
    "",
    """
-- Extend a lease if it is still ours.
-- KEYS[1] lock hash   ARGV[1] owner   ARGV[2] token ('' = any of this owner's)   ARGV[3] ms
-- returns 1 extended, 0 gone or held by someone else
local token = redis.call('HGET', KEYS[1], ARGV[1])
if token and (ARGV[2] == '' or token == ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
""",
)

RELEASE = _script(
    "release",
    _NOTIFY,
    """
-- Compare-and-delete by owner (and token), then wake the next waiter.
-- KEYS[1] lock hash   KEYS[2] queue   KEYS[3] deadlines
-- ARGV[1] owner   ARGV[2] token ('' = any of this owner's)   ARGV[3] the name's channel
-- ARGV[4] prefix of the waiters' own channels
-- returns 1 released, 0 not held by this owner (expired, taken over or force-released)
local token = redis.call('HGET', KEYS[1], ARGV[1])
if not token or (ARGV[2] ~= '' and token ~= ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
notify(KEYS[2], KEYS[3], ARGV[3], ARGV[4])
return 1
""",
)

RELEASE_TRANSFER = _script(
    "release_transfer",
    _NOTIFY + _LINE,
    """
-- Release and grant at once to another owner of the same process (non-fair; no message).
-- KEYS[1] lock hash   KEYS[2] fencing counter   KEYS[3] queue   KEYS[4] deadlines
-- ARGV[1] releasing owner   ARGV[2] its token ('' = any)   ARGV[3] receiving owner
-- ARGV[4] its lease ms   ARGV[5] the name's channel   ARGV[6] waiters' channel prefix
-- returns the receiver's NEW token (>= 1); 0 not held by ARGV[1] (nothing changed);
--   -1 released, but the first in line is not ARGV[3]: it was called as by RELEASE
local token = redis.call('HGET', KEYS[1], ARGV[1])
if not token or (ARGV[2] ~= '' and token ~= ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
local head = others_first(KEYS[3], KEYS[4], '!' .. ARGV[3])
if head then
  call_next(head, ARGV[5], ARGV[6])
  return -1
end
local granted = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], ARGV[3], granted)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return granted
""",
)

ABANDON = _script(
    "abandon",
    _NOTIFY,
    """
-- Remove an owner's attempt: the lock if it holds it, and its place in line; wake the next
-- waiter if that frees the way.
-- KEYS[1] lock hash   KEYS[2] queue   KEYS[3] deadlines
-- ARGV[1] owner   ARGV[2] the name's channel   ARGV[3] waiters' channel prefix
-- ARGV[4] '' both; 'hold' the lock only (Redlock undoing the grants of a vote it lost);
--   'line' the place only (Redlock, on the nodes that did not grant a vote it won)
-- returns 1 if the owner held the lock (now deleted), else 0
local held = ARGV[4] ~= 'line' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
if held then redis.call('DEL', KEYS[1]) end
local was_head = false
if ARGV[4] ~= 'hold' then
  for _, member in ipairs({ARGV[1], '!' .. ARGV[1]}) do
    if redis.call('ZREM', KEYS[3], member) == 1 then
      was_head = was_head or first(KEYS[2]) == member
      redis.call('ZREM', KEYS[2], member)
    end
  end
end
if held or (was_head and redis.call('EXISTS', KEYS[1]) == 0) then
  notify(KEYS[2], KEYS[3], ARGV[2], ARGV[3])
end
if held then return 1 end
return 0
""",
)

FORCE_RELEASE = _script(
    "force_release",
    _NOTIFY,
    """
-- Break the lock whoever holds it (admin), then wake the next waiter.
-- KEYS[1] lock hash   KEYS[2] queue   KEYS[3] deadlines
-- ARGV[1] the name's channel   ARGV[2] waiters' channel prefix
-- returns 1 if a lock was deleted, else 0
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
notify(KEYS[2], KEYS[3], ARGV[1], ARGV[2])
return 1
""",
)

STATUS = _script(
    "status",
    _NOW,
    """
-- Who holds a lock (read only).
-- KEYS[1] lock hash   KEYS[2] deadlines
-- returns {} when free, else {owner, token, pttl, waiters}; waiters: live places in line,
--   -1 when the name has no line
local pairs_ = redis.call('HGETALL', KEYS[1])
if #pairs_ < 2 then return {} end
local waiters = -1
if redis.call('EXISTS', KEYS[2]) == 1 then
  waiters = redis.call('ZCOUNT', KEYS[2], '(' .. now_ms(), '+inf')
end
return {pairs_[1], tonumber(pairs_[2]), redis.call('PTTL', KEYS[1]), waiters}
""",
)

ALL_SCRIPTS = (
    *(ACQUIRE, ACQUIRE_FAIR, RENEW, RELEASE, RELEASE_TRANSFER),
    *(ABANDON, FORCE_RELEASE, STATUS),
)

# -- the two scripts Redlock adds ------------------------------------------------------------

RAISE_COUNTER = _script(
    "raise_counter",
    "",
    """
-- Raise a fencing counter to at least a token handed out by another node.
-- KEYS[1] fencing counter   ARGV[1] the token
-- returns the counter after the call
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
  redis.call('SET', KEYS[1], ARGV[1])
  return wanted
end
return current
""",
)

REJOIN = _script(
    "rejoin",
    _NOW,
    """
-- From when this node's votes count (run on every new connection with rejoin_delay).  A
-- marker holds that server time; a node that lost its data has none: it counts only
-- rejoin_delay after the first client saw it empty (every lease it forgot has ended).
-- KEYS[1] marker   ARGV[1] rejoin delay ms
-- returns ms until the node counts (0 or less: now)
local now = now_ms()
local from = redis.call('GET', KEYS[1])
if not from then
  from = now + tonumber(ARGV[1])
  redis.call('SET', KEYS[1], from)
end
return tonumber(from) - now
""",
)

REDLOCK_SCRIPTS = (*ALL_SCRIPTS, RAISE_COUNTER)
