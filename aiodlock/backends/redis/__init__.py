"""Redis backends: ``redis://`` (one server, Sentinel, Cluster) and ``redlock://``.

Modules, by what they do:

* ``_scripts``: key layout and the Lua scripts (shared by both backends);
* ``_wire``: the pipelined connection to one server (:class:`~._wire.Link`);
* ``_pubsub``: one pub/sub connection shared by every waiter (:class:`~._pubsub.PubSubHub`);
* ``_node``: the lock protocol on one deployment (:class:`~._node.RedisNode`);
* ``_deployments``: URL settings, TLS, Sentinel, which links a deployment gets;
* ``_cluster``: Redis Cluster (the slot map, a link per master, MOVED/ASK);
* ``_waiting`` / ``_redlock_waiting``: local waiters and the same-process hand-off;
* ``backend``: :class:`RedisBackend`; ``redlock``: :class:`RedlockBackend`;
* ``_quorum``: Redlock's nodes, fan-out and vote counting.
"""

from .backend import RedisBackend
from .redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend"]
