"""The SQL of the advisory strategy, and the names it derives: the 64-bit key of a lock and
the NOTIFY channel of a namespace."""

from __future__ import annotations

import functools
import hashlib

__all__ = [
    "call_next",
    "channel_of",
    "client_of",
    "create_table",
    "lock_key",
    "quote_ident",
    "status",
    "try_free",
    "try_lock",
    "unlock_calling",
]


@functools.lru_cache(maxsize=1024)
def lock_key(namespace: str, name: str) -> int:
    """The advisory lock key of ``name`` in ``namespace``: the first 8 bytes of a BLAKE2b
    digest, as a signed bigint.  Stable across processes, versions and platforms.  Two names
    that share a key (a chance of about n²/2⁶⁵ among n names) only contend for one lock."""
    digest = hashlib.blake2b(
        f"{namespace}\0{name}".encode("utf-8", "surrogatepass"), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def channel_of(namespace: str) -> str:
    """The NOTIFY channel of ``namespace`` (an identifier of at most 63 bytes, any namespace)."""
    digest = hashlib.blake2b(namespace.encode("utf-8", "surrogatepass"), digest_size=8)
    return f"aiodlock_{digest.hexdigest()}"


def quote_ident(name: str) -> str:
    """A (possibly schema-qualified) SQL identifier, each part double-quoted."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def create_table(table: str) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {table} ("
        " key bigint PRIMARY KEY,"
        " name bytea NOT NULL,"  # (UTF-8; text cannot hold a NUL)
        " owner bytea NOT NULL,"
        " token bigint NOT NULL,"
        " pid integer NOT NULL,"  # the holder's session (status() checks it holds the key)
        " granted_at timestamptz NOT NULL DEFAULT now())"
        # (room on each page: a grant's update of the row stays on its page, HOT)
        " WITH (fillfactor = 50)"
    )


#: The arguments of a key's *line mark*: the two-int4 advisory lock (a lock space apart from
#: the bigint keys') that every client in the key's line holds SHARED on its LISTEN session
#: while its row is in the line (taken before the row is made, given back once it is gone,
#: and gone with the session).  A statement that finds nobody in line through it, by taking
#: it EXCLUSIVE for its own transaction (``pg_try_advisory_xact_lock``, a probe of the lock
#: manager), reads no table: the uncontended path's attempt and release skip the line.
#: (Derived from the key: two keys that share a mark, or an application's own two-int lock
#: on it, only send a statement to the table's reads.)
MARK = "($1::bigint >> 32)::int, ($1::bigint & 2147483647)::int"

#: Nobody is in the key's line (the mark was free; held to the end of the transaction).
NOBODY_IN_LINE = f"pg_try_advisory_xact_lock({MARK})"


def _bump(table: str, taken: str) -> str:
    """The INSERT that bumps the key's counter row (made at 1) when ``taken`` (a condition
    on the CTE ``got``) holds, writing the holder with it -> the new token."""
    return (
        f"INSERT INTO {table} AS c (key, name, owner, token, pid) "
        f"SELECT $1::bigint, $2::bytea, $3::bytea, 1, pg_backend_pid() FROM got WHERE {taken} "
        "ON CONFLICT (key) DO UPDATE SET token = c.token + 1, name = EXCLUDED.name, "
        "owner = EXCLUDED.owner, pid = EXCLUDED.pid, granted_at = now() RETURNING token"
    )


def try_free(table: str) -> str:
    """$1 key, $2 name, $3 owner (UTF-8) -> (ok, token): the attempt of a client not in the
    key's line when nobody is in it (the line mark is free: no table but the counter row is
    read, and no plan of the line's is even started), the lock tried and, when taken, the
    counter row bumped in the same statement.  ``ok`` NULL: somebody is in the line, and
    :func:`try_lock` decides; false: held by another session; true: taken, ``token``."""
    return (
        f"WITH got AS (SELECT CASE WHEN {NOBODY_IN_LINE}"
        " THEN pg_try_advisory_lock($1::bigint) END AS ok),"
        f" bumped AS ({_bump(table, 'got.ok')})"
        " SELECT got.ok, (SELECT token FROM bumped) FROM got"
    )


def try_lock(table: str, waiters: str, *, in_line: bool) -> str:
    """$1 key, $2 name, $3 owner (UTF-8), $4 the pid of this client's LISTEN session (0: none),
    and with ``in_line`` (this client has a row in the line of the key) $5 channel, $6
    urgent, $7 called -> the new token (one row) when the lock was taken, else no row.

    Nobody barges past the urgent line: the lock is tried only when no live client other than
    this one has an urgent row for the key that ranks first (an earlier ``urgent_since`` than
    this client's, any if it has none; any task of an urgent client has its client's place).
    (A client not in line sends it when :func:`try_free` found somebody in line.)  The
    counter row is bumped only when the lock was taken, in the same statement (one round
    trip); each CTE runs once (a volatile function is never inlined), and CASE tries the
    lock only when it must.

    ``in_line`` only (the statement of a client that waits, off the uncontended path): an
    urgent attempt marks this client's row urgent (it keeps its first mark); a grant to a
    marked client moves its mark to the back of the urgent line (its other waiters stay
    urgent; the row goes when its last waiter leaves).  A barred attempt that finds the lock
    FREE (tried and given back at once) calls the first urgent client if this client was
    ``called`` since its last attempt: the release called this one, as the urgent one was
    marking its row.  (An attempt nobody called, a poll or a turn to urgent, leaves the
    call to the release: the release called the urgent client itself, and a second call
    would reach the next client twice.  A client not in line was not called either.)"""
    urgent = f"FROM {waiters} w WHERE w.key = $1::bigint AND w.urgent_since IS NOT NULL"
    urgent += f" AND w.pid <> $4::int AND {alive('w.pid')}"
    if not in_line:
        return (
            f"WITH got AS (SELECT CASE WHEN EXISTS (SELECT 1 {urgent}) THEN false"
            " ELSE pg_try_advisory_lock($1::bigint) END AS ok) "
        ) + _bump(table, "got.ok")
    first = f"SELECT w.pid {urgent} ORDER BY w.urgent_since, w.pid LIMIT 1"
    urgent += " AND (m.t IS NULL OR (w.urgent_since, w.pid) < (m.t, $4::int))"
    taken = (
        "CASE WHEN got.st = 1 THEN true WHEN got.st = 2 AND $7::bool THEN (SELECT false FROM"
        f" ({first}) f, pg_notify($5::text || '_' || f.pid::text, $1::bigint::text))"
        " ELSE false END"
    )
    return (
        "WITH mine AS (SELECT COALESCE((SELECT urgent_since FROM"
        f" {waiters} WHERE key = $1::bigint AND pid = $4::int),"
        " CASE WHEN $6::bool THEN clock_timestamp() END) AS t), "
        f"got AS (SELECT CASE WHEN NOT EXISTS (SELECT 1 {urgent}) THEN"
        " CASE WHEN pg_try_advisory_lock($1::bigint) THEN 1 ELSE 0 END"
        " WHEN pg_try_advisory_lock($1::bigint) THEN"
        " CASE WHEN pg_advisory_unlock($1::bigint) THEN 2 ELSE 2 END ELSE 0 END AS st,"
        " m.t FROM mine m), "
        f"mark AS (UPDATE {waiters} w SET urgent_since = CASE WHEN got.st = 1"
        " THEN clock_timestamp() ELSE got.t END FROM got"
        " WHERE w.key = $1::bigint AND w.pid = $4::int AND ((got.st = 1 AND w.urgent_since"
        " IS NOT NULL) OR (got.st <> 1 AND got.t IS NOT NULL AND w.urgent_since IS NULL))) "
    ) + _bump(table, taken)


def create_waiters(waiters: str, *, clients: bool = False) -> str:
    """The line of LISTEN sessions; ``clients`` (the table strategy's): each row names the
    id of its session's client, whose owners' waiters it wakes."""
    return (
        f"CREATE TABLE IF NOT EXISTS {waiters} ("
        " key bigint NOT NULL,"
        " pid integer NOT NULL,"  # the waiting client's LISTEN session
        " since timestamptz NOT NULL DEFAULT clock_timestamp(),"
        # (advisory: since when one of its waiters is urgent; NULL: none is)
        " urgent_since timestamptz,"
        + (" client text," if clients else "")
        + " PRIMARY KEY (key, pid))"
    )


def _has_column(column: str) -> str:
    """$1 a table (quoted) -> has it ``column``."""
    return (
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1::text)"
        f" AND attname = '{column}' AND NOT attisdropped)"
    )


#: $1 a waiters table (quoted) -> has it the ``urgent_since`` column (a table made before
#: it existed has not: :func:`add_urgent`).
HAS_URGENT = _has_column("urgent_since")
#: $1 a waiters table (quoted) -> has it the ``client`` column (:func:`add_client`).
HAS_CLIENT = _has_column("client")


def add_urgent(waiters: str) -> str:
    return f"ALTER TABLE {waiters} ADD COLUMN IF NOT EXISTS urgent_since timestamptz"


def add_client(waiters: str) -> str:
    return f"ALTER TABLE {waiters} ADD COLUMN IF NOT EXISTS client text"


def client_of(owner: str) -> str:
    """The id of the client of ``owner`` (a column or an expression), in SQL, as
    :func:`aiodlock._types.client_of` reads it."""
    return f"split_part(split_part({owner}, '/', 1), ':', 1)"


def alive(pid: str) -> str:
    """The session ``pid`` (a column) still exists."""
    return f"EXISTS (SELECT 1 FROM pg_stat_get_activity({pid}) a WHERE a.pid IS NOT NULL)"


#: A session that no longer exists (its client died without leaving the line).
DEAD_PID = "NOT " + alive("pid")


def join_line(waiters: str, *, mark: bool = False, client: bool = False) -> str:
    """$1 key: this LISTEN session waits for it (rows of dead sessions go on the way);
    ``mark``: it takes the key's line mark (:data:`MARK`) before its row is made;
    ``client``: $2 the id of its client (NULL: unknown), kept in the row."""
    marked = f"m AS (SELECT pg_advisory_lock_shared({MARK})), " if mark else ""
    columns, values = ("key, pid, client", ", $2::text") if client else ("key, pid", "")
    return (
        f"WITH {marked}gone AS (DELETE FROM {waiters} WHERE key = $1::bigint AND "
        + DEAD_PID
        + f") INSERT INTO {waiters} ({columns}) SELECT $1::bigint, pg_backend_pid(){values}"
        + (" FROM m" if mark else "")
        + " ON CONFLICT DO NOTHING"
    )


def leave_line(waiters: str, *, mark: bool = False) -> str:
    """$1 key: this client waits for it no more (``mark``: it gives its line mark back)."""
    gone = f"DELETE FROM {waiters} WHERE key = $1::bigint AND pid = pg_backend_pid()"
    if not mark:
        return gone
    return f"WITH gone AS ({gone}) SELECT pg_advisory_unlock_shared({MARK})"


#: The order of a line: by ``since``; with urgent clients, those first.
_ORDER = {False: "since", True: "urgent_since NULLS LAST, since"}


def _first_alive(waiters: str, order: str, others: bool = False) -> str:
    """$1 key -> the pid of the first live client in the key's line, in ``order`` (``others``:
    not this session).  Whether a session lives is asked of the rows in line order until one
    does, not of the whole line (each asking reads the server's list of sessions: with 100
    clients in line, a millisecond).  (PostgreSQL keeps a subquery with ORDER BY apart and
    reads its rows in that order; were one ever read out of order, the call would reach a
    later client, which takes the lock or, barred by an urgent client, passes the call on
    to it: not the line's order, never a lost call.)"""
    mine = " AND pid <> pg_backend_pid()" if others else ""
    return (
        f"SELECT o.pid FROM (SELECT pid FROM {waiters} WHERE key = $1::bigint{mine}"
        f" ORDER BY {order}) o WHERE {alive('o.pid')} LIMIT 1"
    )


def pass_on(waiters: str, urgent: bool = False, *, mark: bool = False) -> str:
    """$1 key, $2 channel: leave the line of ``key``, calling the next client in it (this
    client was called and its waiter left without asking: a timeout, a cancellation);
    ``urgent``: the line has urgent clients, who come first; ``mark``: it gives its line
    mark back."""
    call = (
        "SELECT pg_notify($2::text || '_' || w.pid::text, $1::bigint::text) FROM"
        f" ({_first_alive(waiters, _ORDER[urgent], others=True)}) w"
    )
    gone = f"WITH gone AS (DELETE FROM {waiters} WHERE key = $1::bigint AND pid = pg_backend_pid())"
    if not mark:
        return f"{gone} {call}"
    return f"{gone} SELECT pg_advisory_unlock_shared({MARK}), ({call})"


def call_next(waiters: str) -> str:
    """$1 key, $2 channel: NOTIFY (at commit) the channel of ONE client, the one that has
    waited longest for ``key`` (``{channel}_{pid}``, the pid of its LISTEN session), with the
    key: that client alone hears it, and wakes one of its waiters of the key.  An urgent
    client comes first (the one urgent longest).  Nothing is sent when nobody waits.  Sent
    after :data:`UNLOCK` found the key's line mark held, and after :func:`unlock_calling`
    found it held but no row (one committed after that statement's snapshot was taken)."""
    return (
        "SELECT pg_notify($2::text || '_' || w.pid::text, $1::bigint::text) FROM "
        f"({_first_alive(waiters, _ORDER[True])}) w"
    )


#: $1 key -> (was it held, may a client wait for it).  The unlock, then a probe of the
#: key's line mark (no table is read): a release that nobody waits for costs the server
#: next to nothing, and one that somebody may wait for is followed by :func:`call_next`.
#: (In this order: a waiter whose attempt failed before the unlock holds its mark by then.)
UNLOCK = f"SELECT pg_advisory_unlock($1::bigint), NOT {NOBODY_IN_LINE}"


def unlock_calling(waiters: str) -> str:
    """$1 key, $2 channel -> (was it held, called): :data:`UNLOCK` and :func:`call_next` in
    one round trip, for a key that somebody likely waits for.  ``called`` NULL: nobody is in
    line (the line's subquery never ran); else how many clients were called: 0 when the
    mark is held but the statement's snapshot, taken before the unlock, holds no live row (a
    client that joined the line as the release began): :func:`call_next` follows, with a
    snapshot of its own.  (The server sets up the subquery's plan, and locks the waiters
    table, as the statement starts, even when the subquery does not run: about a tenth of
    an uncontended cycle, so an uncontended release sends :data:`UNLOCK`.)"""
    return (
        f"SELECT pg_advisory_unlock($1::bigint), CASE WHEN NOT {NOBODY_IN_LINE}"
        f" THEN (SELECT count(*) FROM ({call_next(waiters)}) n) END"
    )


_HELD_BY = (
    "FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid::bigint = (($1::bigint >> 32) & 4294967295)"
    " AND l.objid::bigint = ($1::bigint & 4294967295)"
)


def status(table: str) -> str:
    """$1 key -> (pid, name, owner, token) of the session holding it, with the counter row
    when that session took it through aiodlock (NULLs otherwise)."""
    return (
        "SELECT h.pid, c.name, c.owner, c.token "
        f"FROM (SELECT l.pid {_HELD_BY} LIMIT 1) h "
        f"LEFT JOIN {table} c ON c.key = $1::bigint AND c.pid = h.pid"
    )


#: $1 key, $2 wait (ms) -> how many other sessions holding the key were ended (waited for:
#: their locks are free once it returns).
TERMINATE = (
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(h.pid, $2::bigint))"
    f" FROM (SELECT DISTINCT l.pid {_HELD_BY} AND l.pid <> pg_backend_pid()) h"
)

#: $1 channel, $2 key: announce a release the holder's session could not announce, on the
#: namespace's channel, which every client hears (one waiter of each wakes).
NOTIFY = "SELECT pg_notify($1::text, $2::bigint::text)"


def encode(text: str) -> bytes:
    """A name or owner as stored (any str, lone surrogates and NULs included)."""
    return text.encode("utf-8", "surrogatepass")


def decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")
