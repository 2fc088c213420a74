"""aiodlock: asyncio-native distributed locks.

``async with aiodlock.connect(url) as client, client.lock("orders:42") as lease: ...``
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

# Public names report the public module (``aiodlock.ConfigurationError`` in a traceback, a
# ``repr`` or ``help()``, as httpx does), not the private module that defines them.  Pickle
# finds them there too: each is an attribute of ``aiodlock`` under the same name.
for _name in __all__:
    _public = globals()[_name]
    if getattr(_public, "__qualname__", None) == _name:  # a class or a function
        _public.__module__ = __name__
del _name, _public
