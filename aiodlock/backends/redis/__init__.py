"""Redis backends: ``redis://`` (one server, Sentinel, Cluster) and ``redlock://``.

``_scripts`` (keys, Lua), ``_wire`` (the one transport), ``_pubsub`` (the shared pub/sub
connection and the waiters), ``_node`` (script calls, links), ``_deployments`` and
``_cluster`` (settings, Sentinel, Cluster), ``backend``, ``redlock`` and ``_quorum``.
"""

from .backend import RedisBackend
from .redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend"]
