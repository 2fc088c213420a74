"""aiodlock: asyncio-native distributed locks.

>>> import aiodlock
>>> client = aiodlock.connect("redis://127.0.0.1:6379/0")   # doctest: +SKIP
>>> async with client, client.lock("orders:42") as lease:    # doctest: +SKIP
...     print(lease.token)
"""

from ._client import Client, connect, default_url
from ._errors import (
    BackendError,
    BackendTimeout,
    ConfigurationError,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    Unsupported,
)
from ._hold import OnLost
from ._lease import Lease
from ._lock import Lock
from ._observers import Observer
from ._types import LockStatus

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendTimeout",
    "Client",
    "ConfigurationError",
    "Lease",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockStatus",
    "LockTimeout",
    "Observer",
    "OnLost",
    "Unsupported",
    "__version__",
    "connect",
    "default_url",
]
