"""The key layout: ``/{namespace}/locks/{escaped name}/{lease hex}``, and
``{lease hex}.{slot}`` for the second and later waiters of one client on one name.

As in etcd's concurrency Mutex, a waiter's key is named by its session's lease, so that a
client uses the same key for every acquisition of a name (its owner is the key's value).
A key that is made and deleted over and over costs the server nothing, where a new key per
acquisition would leave a dead entry in etcd's index until the next compaction, for every
range read of the lock's line to step over.  A client's tasks that wait for one name at the
same time each take a slot of their own; a slot is taken again only once its key is known
to be deleted.  Escaping is injective and keeps ``/`` out of a segment, so one lock's prefix
never holds another's keys.
"""

from __future__ import annotations

from urllib.parse import quote, unquote_to_bytes

_SAFE = "-_.~:"  # kept as they are, with letters and digits; everything else is %XX


def escape(text: str) -> str:
    """``text`` as ONE key segment: UTF-8 percent-encoding but for letters, digits, ``-_.~:``."""
    return quote(text.encode("utf-8", "surrogatepass"), safe=_SAFE)


def unescape(segment: str) -> str:
    return unquote_to_bytes(segment).decode("utf-8", "surrogatepass")


class Keys:
    """The keys of one namespace."""

    __slots__ = ("_prefixes", "locks")

    #: How many names' prefixes are kept (a lock is mostly taken again and again).
    cached = 4096

    def __init__(self, namespace: str) -> None:
        self.locks = f"/{escape(namespace)}/locks/"
        self._prefixes: dict[str, bytes] = {}

    def prefix(self, name: str) -> bytes:
        """Every key of the lock ``name`` (its holder and its waiters) starts with this."""
        prefix = self._prefixes.get(name)
        if prefix is None:
            if len(self._prefixes) >= self.cached:
                self._prefixes.clear()
            prefix = self._prefixes[name] = f"{self.locks}{escape(name)}/".encode()
        return prefix

    def key(self, prefix: bytes, lease: int, slot: int = 0) -> bytes:
        """The key of slot ``slot`` of a client with ``lease`` in the line of ``prefix``."""
        return prefix + (f"{lease:x}.{slot}" if slot else f"{lease:x}").encode()
