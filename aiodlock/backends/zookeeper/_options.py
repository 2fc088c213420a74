"""The backend's options: the URL, digest credentials, ACLs, ``describe()``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from aiozk import ACL, protocol

from ..._errors import ConfigurationError
from ..._url import ParsedURL, take_str
from ._paths import parse_chroot

__all__ = ["ACL_PRESETS", "DEFAULT_PORT", "acl_for", "describe", "parse_url"]

DEFAULT_PORT = 2181

ACL_PRESETS: dict[str, list[Any]] = {
    # world:anyone may do anything (ZooKeeper's OPEN_ACL_UNSAFE; kazoo's and Curator's default)
    "open": [protocol.UNRESTRICTED_ACCESS],
    # only the authenticated creator (digest credentials) may do anything
    "creator": [protocol.AUTHED_UNRESTRICTED],
    # the creator may do anything, anyone may read (so others can see status())
    "creator_read": [protocol.AUTHED_UNRESTRICTED, protocol.WORLD_READABLE],
}


def parse_url(
    url: ParsedURL, options: dict[str, Any]
) -> tuple[str, list[tuple[str, int]], str, str | None, str | None]:
    """``(scheme, hosts, chroot, username, password)`` from ``url`` and ``options``."""
    if url.scheme not in ("zookeeper", "zk"):
        raise ConfigurationError(f"not a ZooKeeper URL scheme: {url.scheme!r}")
    hosts = url.host_list(DEFAULT_PORT) or [("127.0.0.1", DEFAULT_PORT)]
    chroot = parse_chroot(url.path)
    username = take_str(options, "username", url.username)
    password = take_str(options, "password", url.password, secret=True)
    if (username is None) != (password is None):
        raise ConfigurationError(
            "ZooKeeper digest authentication needs both a user name and a password "
            "(zookeeper://USER:PASSWORD@host/...)"
        )
    if username is not None and ":" in username:
        raise ConfigurationError("a ZooKeeper digest user name must not contain ':'")
    return url.scheme, hosts, chroot, username, password


def acl_for(acl: Any, username: str | None) -> tuple[str, list[Any]]:
    """``(name, ACL list)`` of the nodes a client creates: a preset, or ``"custom"``."""
    if not isinstance(acl, str):
        if not isinstance(acl, list | tuple):
            raise ConfigurationError(
                f"option 'acl' must be one of {', '.join(ACL_PRESETS)} or a list of aiozk.ACL"
            )
        if not acl or not all(isinstance(item, ACL) for item in acl):
            raise ConfigurationError("option 'acl' must be a non-empty list of aiozk.ACL")
        return "custom", list(acl)
    if acl not in ACL_PRESETS:
        raise ConfigurationError(
            f"option 'acl' must be one of {', '.join(ACL_PRESETS)} or a list of "
            f"aiozk.ACL, got {acl!r}"
        )
    if acl != "open" and username is None:
        raise ConfigurationError(
            f"acl={acl!r} needs digest credentials (zookeeper://USER:PASSWORD@...)"
        )
    return acl, list(ACL_PRESETS[acl])


def describe(
    scheme: str, username: str | None, hosts: Sequence[tuple[str, int]], chroot: str
) -> str:
    """The URL with the password masked."""
    auth = f"{quote(username, safe='')}:***@" if username is not None else ""
    servers = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)
    return f"{scheme}://{auth}{servers}{quote(chroot)}"
