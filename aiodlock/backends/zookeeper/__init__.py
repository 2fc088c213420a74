"""``zookeeper://`` / ``zk://``: locks as ephemeral sequential nodes (see :mod:`.backend`)."""

from ._paths import escape_segment, unescape_segment
from ._session import Disconnected
from .backend import ZooKeeperBackend

__all__ = ["Disconnected", "ZooKeeperBackend", "escape_segment", "unescape_segment"]
