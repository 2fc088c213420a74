"""Parsing of lock-server URLs.

A URL names a backend by its scheme and may list several hosts
(``redlock://h1:6379,h2:6379,h3:6379``), a user and password, a path and query options.
The password is kept apart and never shown: ``repr()`` and :meth:`ParsedURL.redacted`
print ``***`` in its place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from ._checks import MAX_SECONDS
from ._errors import ConfigurationError

__all__ = [
    "ParsedURL",
    "parse_url",
    "sqlite_url",
    "take_bool",
    "take_float",
    "take_int",
    "take_str",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ParsedURL:
    """A lock-server URL split into its parts (the password is hidden from ``repr``)."""

    scheme: str
    hosts: tuple[tuple[str, int | None], ...]
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    path: str
    query: Mapping[str, str]
    raw_netloc: str = dataclasses.field(repr=False, default="")

    def redacted(self) -> str:
        """The URL with the password replaced by ``***`` (safe for logs and errors)."""
        auth = ""
        if self.username is not None or self.password is not None:
            auth = self.username or ""
            if self.password is not None:
                auth += ":***"
            auth += "@"
        hosts = ",".join(_format_host(h, p) for h, p in self.hosts)
        query = "&".join(f"{k}={v}" for k, v in self.query.items())
        return f"{self.scheme}://{auth}{hosts}{self.path}" + (f"?{query}" if query else "")

    def __str__(self) -> str:
        return self.redacted()

    def host_list(self, default_port: int) -> list[tuple[str, int]]:
        """Every host with ``default_port`` filled in where the URL gave none."""
        return [(h, p if p is not None else default_port) for h, p in self.hosts]


def _format_host(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def parse_url(url: str) -> ParsedURL:
    """Split ``url``; raises :class:`ConfigurationError` naming the bad part."""
    if not isinstance(url, str):
        raise ConfigurationError(f"the URL must be a str, not {type(url).__name__}")
    if "://" not in url:
        raise ConfigurationError(
            f"not a URL: {_mask(url)!r} (expected 'scheme://...', e.g. 'redis://127.0.0.1:6379/0')"
        )
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if not scheme or not all(c.isalnum() or c in "+-." for c in scheme):
        raise ConfigurationError(f"bad URL scheme {scheme!r}")
    if "#" in rest:
        rest = rest.split("#", 1)[0]
    query_text = ""
    if "?" in rest:
        rest, query_text = rest.split("?", 1)
    netloc, slash, path = rest.partition("/")
    path = slash + path
    username: str | None = None
    password: str | None = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) if user else None
        password = unquote(pw) if colon else None
    hosts: list[tuple[str, int | None]] = []
    if netloc:
        for part in netloc.split(","):
            hosts.append(_parse_host(part.strip(), scheme))
    query: dict[str, str] = {}
    for key, value in parse_qsl(query_text, keep_blank_values=True):
        if key in query:
            raise ConfigurationError(f"URL query option {key!r} is given more than once")
        query[key] = value
    return ParsedURL(scheme, tuple(hosts), username, password, path, query, netloc)


def sqlite_url(path: str) -> str:
    """The ``sqlite://`` URL of the file ``path`` (absolute or relative), read back as that
    path: ``sqlite:///`` + path, or, when the path has a ``?`` or ``#`` (where a URL's path
    ends), the percent-encoded option ``path``."""
    if "?" in path or "#" in path:
        return "sqlite://?path=" + quote(path, safe="/")
    return "sqlite:///" + path


def _parse_host(part: str, scheme: str) -> tuple[str, int | None]:
    if not part:
        raise ConfigurationError(f"empty host in the {scheme}:// URL's host list")
    if part.startswith("["):
        host, bracket, tail = part[1:].partition("]")
        if not bracket:
            raise ConfigurationError(f"bad IPv6 host {part!r} in the URL (missing ']')")
        port_text = tail[1:] if tail.startswith(":") else None
        if tail and not tail.startswith(":"):
            raise ConfigurationError(f"bad host {part!r} in the URL")
    else:
        host, colon, port_text_ = part.partition(":")
        port_text = port_text_ if colon else None
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigurationError(f"bad port {port_text!r} for host {host!r} in the URL")
        port = int(port_text)
    return unquote(host), port


def _mask(url: str) -> str:
    # Hide anything that looks like user:password@ in a string that failed to parse.
    if "@" in url:
        return "***@" + url.rsplit("@", 1)[1]
    return url


# Option helpers.  Options come as keyword arguments (native types) or URL query strings.
# Each helper removes the option from ``options`` and converts it, naming it on error.

_MISSING: Any = object()


def take_float(
    options: MutableMapping[str, Any],
    name: str,
    default: float | None,
    *,
    minimum: float | None = None,
    allow_zero: bool = True,
    allow_none: bool = False,
) -> float | None:
    value = options.pop(name, _MISSING)
    if value is _MISSING:
        return default
    if value is None or (isinstance(value, str) and value.lower() in ("none", "")):
        if allow_none:
            return None
        raise ConfigurationError(f"option {name!r} needs a number, got {value!r}")
    if isinstance(value, bool):
        raise ConfigurationError(f"option {name!r} needs a number of seconds, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"option {name!r} needs a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"option {name!r} must be finite, got {value!r}")
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"option {name!r} must be at least {minimum}, got {value!r}")
    if not allow_zero and number <= 0:
        raise ConfigurationError(f"option {name!r} must be greater than 0, got {value!r}")
    if number > MAX_SECONDS:
        raise ConfigurationError(
            f"option {name!r} must be at most one year ({MAX_SECONDS:.0f} s), got {value!r}"
        )
    return number


def take_int(
    options: MutableMapping[str, Any],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    value = options.pop(name, _MISSING)
    if value is _MISSING:
        return default
    if isinstance(value, bool):
        raise ConfigurationError(f"option {name!r} needs an integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"option {name!r} needs an integer, got {value!r}") from None
    if isinstance(value, float) and value != number:
        raise ConfigurationError(f"option {name!r} needs an integer, got {value!r}")
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"option {name!r} must be at least {minimum}, got {value!r}")
    if maximum is not None and number > maximum:
        raise ConfigurationError(f"option {name!r} must be at most {maximum}, got {value!r}")
    return number


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def take_bool(options: MutableMapping[str, Any], name: str, default: bool) -> bool:
    value = options.pop(name, _MISSING)
    if value is _MISSING:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ConfigurationError(f"option {name!r} needs true or false, got {value!r}")


def take_str(
    options: MutableMapping[str, Any], name: str, default: str | None, *, secret: bool = False
) -> str | None:
    value = options.pop(name, _MISSING)
    if value is _MISSING:
        return default
    if value is None:
        return None
    if not isinstance(value, str):
        shown = "***" if secret else repr(value)
        raise ConfigurationError(f"option {name!r} needs a string, got {shown}")
    return value
