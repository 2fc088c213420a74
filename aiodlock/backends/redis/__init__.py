"""Redis backends: ``redis://`` (one server, Sentinel, Cluster) and ``redlock://``.

``_scripts`` (keys, Lua), ``_wire`` (the one transport), ``_pubsub`` (the shared pub/sub
connection and the waiters), ``_deployments`` and ``_cluster`` (settings, links, Sentinel,
Cluster), ``backend`` (with what both backends share), ``redlock`` and ``_quorum``.
"""

from .backend import RedisBackend
from .redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend"]
