"""Lock names as ZooKeeper path segments, child node names and their order, the chroot."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote, unquote_to_bytes

from ..._errors import ConfigurationError

_SAFE = "-_.~:"  # kept as they are, with letters and digits; everything else is %XX


def escape_segment(text: str) -> str:
    """``text`` as ONE path segment (injective): UTF-8 percent-encoding but for letters,
    digits and ``-_.~:``, and a leading ``.`` escaped (a segment is never ``.`` or ``..``)."""
    encoded = quote(text.encode("utf-8", "surrogatepass"), safe=_SAFE)
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    return encoded


def unescape_segment(segment: str) -> str:
    raw = unquote_to_bytes(segment)
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # not one of ours
        return raw.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True, slots=True)
class Child:
    """A lock child node ``{escaped owner}#{attempt}#{sequence}``."""

    name: str
    owner: str  # still escaped
    seq: int  # the 32-bit sequence counter, unsigned


def parse_child(name: str) -> Child | None:
    parts = name.rsplit("#", 2)
    if len(parts) != 3:
        return None
    try:
        seq = int(parts[2])
    except ValueError:
        return None
    return Child(name, parts[0], seq & 0xFFFFFFFF)


def order(names: Iterable[str]) -> list[Child]:
    """The lock queue: children by sequence number, the holder first.

    Sequence numbers come from the parent's 32-bit counter, which wraps around; the queue
    starts after the widest gap between neighbours, so the order stays right across it.
    """
    children = sorted(
        (child for child in map(parse_child, names) if child is not None),
        key=lambda child: child.seq,
    )
    if len(children) > 1:
        widest = max(range(len(children) - 1), key=lambda i: children[i + 1].seq - children[i].seq)
        gap = children[widest + 1].seq - children[widest].seq
        if gap > children[0].seq + 2**32 - children[-1].seq:
            children = children[widest + 1 :] + children[: widest + 1]
    return children


_CHROOT_BAD = re.compile("[\x00-\x1f\x7f\ud800-\uf8ff\ufff0-\uffff]")


def parse_chroot(path: str) -> str:
    """The chroot from a URL path: ``""`` or ``/a/b`` (each segment percent-decoded)."""
    segments = [unquote(part) for part in path.split("/") if part]
    for segment in segments:
        if segment in (".", "..") or _CHROOT_BAD.search(segment) or "/" in segment:
            raise ConfigurationError(
                f"bad ZooKeeper chroot {path!r} in the URL: segment {segment!r} is not a "
                f"valid node name"
            )
    return "".join(f"/{segment}" for segment in segments)
