"""Lock-server URLs and the checked conversion of options.  Secrets (the password, the options
:func:`is_secret` names) are never shown: reprs, redacted URLs and errors print ``***``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from typing import Any, overload
from urllib.parse import parse_qsl, quote, unquote

from ._checks import MAX_SECONDS
from ._errors import ConfigurationError

#: The options that carry a secret, also as the end of a longer name (``ssl_key_password``,
#: ``auth_token``): the one list that the URL display, reprs and errors consult.
SECRET_OPTIONS = ("password", "passwords", "secret", "token", "ssl_keyfile_password")


def is_secret(option: str) -> bool:
    name = option.lower()
    return any(name == s or name.endswith("_" + s) for s in SECRET_OPTIONS)


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class ParsedURL:
    """A lock-server URL split into its parts (``repr`` shows it redacted)."""

    scheme: str
    hosts: tuple[tuple[str, int | None], ...]
    username: str | None
    password: str | None
    path: str
    query: Mapping[str, str]

    def redacted(self) -> str:
        """The URL with the password and secret options as ``***`` (for logs and errors)."""
        auth = (self.username or "") + (":***" if self.password is not None else "")
        auth += "@" if auth else ""  # (parse_url leaves no empty user name)
        hosts = ",".join(format_host(h, p) for h, p in self.hosts)
        query = "&".join(f"{k}={'***' if is_secret(k) else v}" for k, v in self.query.items())
        return f"{self.scheme}://{auth}{hosts}{self.path}" + (f"?{query}" if query else "")

    __str__ = redacted

    def __repr__(self) -> str:
        return f"ParsedURL({self.redacted()!r})"

    def host_list(self, default_port: int) -> list[tuple[str, int]]:
        return [(h, p if p is not None else default_port) for h, p in self.hosts]


def format_host(host: str, port: int | None) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


_ENCODE = (
    "a raw '@' after the host: special characters in a user name or password (and an '@' "
    "in the path) must be percent-encoded ('/' as %2F, '?' as %3F, '#' as %23, '@' as %40)"
)


def parse_url(url: str) -> ParsedURL:
    """Split ``url``; raises :class:`ConfigurationError` naming the bad part."""
    if not isinstance(url, str):
        raise ConfigurationError(f"the URL must be a str, not {type(url).__name__}")
    if "://" not in url:
        shown = "***@" + url.rsplit("@", 1)[1] if "@" in url else url
        raise ConfigurationError(
            f"not a URL: {shown!r} (expected 'scheme://...', e.g. 'redis://127.0.0.1:6379/0')"
        )
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if not scheme or not all(c.isalnum() or c in "+-." for c in scheme):
        raise ConfigurationError(f"bad URL scheme {scheme!r}")
    rest, _, fragment = rest.partition("#")
    rest, _, query_text = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    # A raw '/', '?' or '#' in a password ends the host part early ('u:pa/ss@h'): the '@'
    # then shows up later, and the password's head would be read (and shown) as a host or
    # port.  Such a URL is refused without echoing any of it.
    late_at = bool(netloc) and "@" not in netloc and "@" in path + query_text + fragment
    keys = (part.partition("=")[0] for part in query_text.split("&"))
    if late_at and ("@" in path + fragment or any("@" in key for key in keys)):
        raise ConfigurationError(f"bad {scheme}:// URL: {_ENCODE}")
    userinfo, _, netloc = netloc.rpartition("@")
    user, colon, pw = userinfo.partition(":")
    username = unquote(user) if user else None
    password = unquote(pw) if colon else None
    try:
        hosts = tuple(_parse_host(part.strip(), scheme) for part in netloc.split(",") if netloc)
    except ConfigurationError:
        if late_at:  # the '@' is in a query value, and the host part is a password's head
            raise ConfigurationError(f"bad {scheme}:// URL: {_ENCODE}") from None
        raise
    query: dict[str, str] = {}
    for key, value in parse_qsl(query_text, keep_blank_values=True):
        if key in query:
            raise ConfigurationError(f"URL query option {key!r} is given more than once")
        query[key] = value
    return ParsedURL(scheme, hosts, username, password, slash + path, query)


def sqlite_url(path: str) -> str:
    """``sqlite:///`` + ``path``, or the option ``path`` when it has a ``?`` or ``#``."""
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
        if tail and not tail.startswith(":"):
            raise ConfigurationError(f"bad host {part!r} in the URL")
        port_text = tail[1:] if tail else None
    else:
        host, colon, port_text_ = part.partition(":")
        port_text = port_text_ if colon else None
    if port_text is not None and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
        raise ConfigurationError(f"bad port {port_text!r} for host {host!r} in the URL")
    return unquote(host), None if port_text is None else int(port_text)


# Each take_* pops an option (a native value, or a URL query string) and converts it.

_MISSING: Any = object()


def _bad(name: str, what: str, value: object) -> ConfigurationError:
    shown = "***" if is_secret(name) else repr(value)
    return ConfigurationError(f"option {name!r} {what}, got {shown}")


@overload
def take_float(
    options: MutableMapping[str, Any],
    name: str,
    default: float,
    *,
    minimum: float | None = ...,
    allow_zero: bool = ...,
) -> float: ...
@overload
def take_float(
    options: MutableMapping[str, Any],
    name: str,
    default: None,
    *,
    minimum: float | None = ...,
    allow_zero: bool = ...,
    allow_none: bool = ...,
) -> float | None: ...
def take_float(
    options: MutableMapping[str, Any],
    name: str,
    default: float | None,
    *,
    minimum: float | None = None,
    allow_zero: bool = True,
    allow_none: bool = False,
) -> float | None:
    """Pop a number of seconds: finite, at most a year (a float default: never ``None``)."""
    value = options.pop(name, _MISSING)
    if value is _MISSING:
        return default
    if allow_none and (value is None or str(value).lower() in ("none", "")):
        return None
    if isinstance(value, bool):
        raise _bad(name, "needs a number of seconds", value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _bad(name, "needs a number", value) from None
    if not math.isfinite(number):
        raise _bad(name, "must be finite", value)
    if minimum is not None and number < minimum:
        raise _bad(name, f"must be at least {minimum}", value)
    if not allow_zero and number <= 0:
        raise _bad(name, "must be greater than 0", value)
    if number > MAX_SECONDS:
        raise _bad(name, f"must be at most one year ({MAX_SECONDS:.0f} s)", value)
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
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or (isinstance(value, float) and value != number):
        raise _bad(name, "needs an integer", value)
    if minimum is not None and number < minimum:
        raise _bad(name, f"must be at least {minimum}", value)
    if maximum is not None and number > maximum:
        raise _bad(name, f"must be at most {maximum}", value)
    return number


_BOOLS = {"1": True, "true": True, "yes": True, "on": True}
_BOOLS.update(dict.fromkeys(("0", "false", "no", "off"), False))


def take_bool(options: MutableMapping[str, Any], name: str, default: bool) -> bool:
    value = options.pop(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    raise _bad(name, "needs true or false", value)


def take_str(options: MutableMapping[str, Any], name: str, default: str | None) -> str | None:
    value = options.pop(name, default)
    if value is None or isinstance(value, str):
        return value
    raise _bad(name, "needs a string", value)
