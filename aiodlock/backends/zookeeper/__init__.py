"""``zookeeper://`` / ``zk://``: locks as ephemeral sequential nodes (see :mod:`.backend`).

* :mod:`._session`: one ZooKeeper session over a succession of aiozk connections;
* :mod:`._paths`: lock names as path segments, child names and their order, the chroot;
* :mod:`.backend`: the lock protocol (:class:`ZooKeeperBackend`).
"""

from ._paths import escape_segment, unescape_segment
from ._session import Disconnected
from .backend import ZooKeeperBackend

__all__ = [
    "Disconnected",
    "ZooKeeperBackend",
    "escape_segment",
    "unescape_segment",
]
