"""Scheme -> backend class, as ``"module:Class"`` imported on first use (``import aiodlock``
never imports a driver); a scheme is listed together with its backend.  Third-party backends
register the same under the entry point group ``aiodlock.backends`` (name = scheme)."""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from .backends._base import Backend

__all__ = ["BUILTIN", "EXTRAS", "known_schemes", "load_backend"]

BUILTIN: dict[str, str] = {
    "memory": "aiodlock.backends.memory:MemoryBackend",
    "sqlite": "aiodlock.backends.sqlite:SQLiteBackend",
    "redis": "aiodlock.backends.redis:RedisBackend",
    "rediss": "aiodlock.backends.redis:RedisBackend",
    "unix": "aiodlock.backends.redis:RedisBackend",
    "redis+sentinel": "aiodlock.backends.redis:RedisBackend",
    "rediss+sentinel": "aiodlock.backends.redis:RedisBackend",
    "redis+cluster": "aiodlock.backends.redis:RedisBackend",
    "rediss+cluster": "aiodlock.backends.redis:RedisBackend",
    "redlock": "aiodlock.backends.redis:RedlockBackend",
    "zookeeper": "aiodlock.backends.zookeeper:ZooKeeperBackend",
    "zk": "aiodlock.backends.zookeeper:ZooKeeperBackend",
    "postgresql": "aiodlock.backends.postgres:PostgresBackend",
    "postgres": "aiodlock.backends.postgres:PostgresBackend",
    "etcd": "aiodlock.backends.etcd:EtcdBackend",
    "etcds": "aiodlock.backends.etcd:EtcdBackend",
    "mysql": "aiodlock.backends.mysql:MySQLBackend",
    "mariadb": "aiodlock.backends.mysql:MySQLBackend",
}

#: The pip extra that brings a scheme's driver (the scheme's own name where it has one).
EXTRAS: dict[str, str] = {
    "redlock": "redlock",
    "zookeeper": "zookeeper",
    "zk": "zookeeper",
    "postgresql": "postgres",
    "postgres": "postgres",
    "etcd": "etcd",
    "etcds": "etcd",
    "mysql": "mysql",
    "mariadb": "mysql",
}
EXTRAS.update(dict.fromkeys([s for s in BUILTIN if s.startswith(("redis", "unix"))], "redis"))


def _entry_points() -> dict[str, str]:
    try:
        eps = importlib.metadata.entry_points(group="aiodlock.backends")
    except Exception:  # pragma: no cover - broken metadata
        return {}
    return {ep.name.lower(): ep.value for ep in eps}


def known_schemes() -> list[str]:
    return sorted(set(BUILTIN) | set(_entry_points()))


def load_backend(scheme: str) -> type[Backend]:
    """The backend class for ``scheme``; ConfigurationError for unknown or uninstalled ones."""
    scheme = scheme.lower()
    target = BUILTIN.get(scheme) or _entry_points().get(scheme)
    if target is None:
        raise ConfigurationError(
            f"unknown URL scheme {scheme!r}; known schemes: {', '.join(known_schemes())}"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        own = module_name == exc.name or module_name.startswith(f"{exc.name}.")
        if own and exc.name and exc.name.startswith("aiodlock"):
            raise ConfigurationError(
                f"the {scheme!r} backend is not available in this version of aiodlock"
            ) from exc
        extra = EXTRAS.get(scheme)
        hint = f'pip install "aiodlock[{extra}]"' if extra else "install its driver"
        raise ConfigurationError(
            f"the {scheme!r} backend needs the package {exc.name!r}: {hint}"
        ) from exc
    cls: type[Backend] = getattr(module, class_name)
    return cls
