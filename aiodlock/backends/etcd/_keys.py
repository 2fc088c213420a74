"""The key layout: ``/{namespace}/locks/{escaped name}/{lease hex}/{escaped owner}/{nonce}``.

etcd's concurrency Mutex names a waiter's key by its session's lease alone; here one client's
lease carries every owner (task) of the client, so the owner completes the key, and a nonce
per acquisition keeps a late clean-up of one acquisition off the next one's key.  Escaping is
injective and keeps ``/`` out of a segment, so one lock's prefix never holds another's keys.
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

    __slots__ = ("locks",)

    def __init__(self, namespace: str) -> None:
        self.locks = f"/{escape(namespace)}/locks/"

    def prefix(self, name: str) -> bytes:
        """Every key of the lock ``name`` (its holder and its waiters) starts with this."""
        return f"{self.locks}{escape(name)}/".encode()

    def key(self, name: str, lease: int, owner: str, nonce: str) -> bytes:
        """The key of ``owner``'s acquisition ``nonce`` of ``name`` under ``lease``."""
        return f"{self.locks}{escape(name)}/{lease:x}/{escape(owner)}/{nonce}".encode()
