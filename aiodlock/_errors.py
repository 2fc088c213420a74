"""The exceptions aiodlock raises.

::

    LockError                          base of everything the library raises
     ├── ConfigurationError (ValueError)  bad URL, option or lock name; an unknown scheme;
     │                                    a missing extra
     ├── Unsupported                      a feature the backend cannot provide
     ├── LockTimeout (TimeoutError)       not acquired in time
     ├── LockNotOwned                     release/extend by a task that does not hold it
     ├── LockLost                         the lease was lost while held
     └── BackendError                     the server failed or is unreachable; the driver's
          └── BackendTimeout (TimeoutError)  exception is kept as ``__cause__``

Backends translate their driver's exceptions in one place (a ``translate`` context manager
built with :func:`translating`), so a caller only ever sees this tree.
"""

from __future__ import annotations

from types import TracebackType

__all__ = [
    "BackendError",
    "BackendTimeout",
    "ConfigurationError",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "Unsupported",
    "describe",
    "translating",
]


class LockError(Exception):
    """Base class of every exception raised by aiodlock."""


class ConfigurationError(LockError, ValueError):
    """A bad URL, option or lock name, an unknown scheme or a missing extra."""


class Unsupported(LockError):
    """The backend cannot provide the requested feature."""


class LockTimeout(LockError, TimeoutError):
    """The lock was not acquired within the timeout."""


class LockNotOwned(LockError):
    """``release()`` or ``extend()`` by a task that does not hold the lock."""


class LockLost(LockError):
    """The lease was lost while the lock was held."""


class BackendError(LockError):
    """The lock server failed or could not be reached."""

    #: The failure is one that time can cure (the server could not be reached, did not
    #: answer in time, is loading its data or failing over): an acquire that is already
    #: waiting for the lock tries again instead of giving up (see the guide, "Outages").
    transient: bool = False


class BackendTimeout(BackendError, TimeoutError):
    """A call to the lock server did not complete within ``op_timeout``."""

    transient = True


class translating:  # (lower case: used as a function, ``with translating(...):``)
    """Map a driver's exceptions onto :class:`BackendError` / :class:`BackendTimeout` (the
    original as ``__cause__``), with messages that name the backend and the operation but
    never a URL (which could carry a password).  ``timeouts`` are checked first (they are
    often subclasses of the driver's base error), then ``transient`` (failures that time can
    cure, as is every builtin :class:`ConnectionError`).  (A class, not a generator: it is
    entered around every statement of the hot paths, where a call that raises nothing must
    cost next to nothing.)"""

    __slots__ = ("backend", "errors", "secrets", "timeouts", "transient", "what")

    def __init__(
        self,
        backend: str,
        errors: tuple[type[BaseException], ...],
        timeouts: tuple[type[BaseException], ...] = (),
        *,
        what: str = "call",
        secrets: tuple[str, ...] = (),
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.backend, self.errors, self.timeouts = backend, errors, timeouts
        self.what, self.secrets, self.transient = what, secrets, transient

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, LockError):
            return
        backend, what = self.backend, self.what
        if isinstance(exc, (TimeoutError, *self.timeouts)):
            raise BackendTimeout(f"{backend}: {what} timed out") from exc
        if isinstance(exc, (*self.transient, *self.errors, OSError)):
            error = BackendError(f"{backend}: {what} failed: {describe(exc, self.secrets)}")
            if isinstance(exc, (*self.transient, ConnectionError)):
                error.transient = True
            raise error from exc


def describe(exc: BaseException, secrets: tuple[str, ...] = ()) -> str:
    """``Type: message`` of an exception, with every secret in ``secrets`` masked."""
    text = str(exc)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
