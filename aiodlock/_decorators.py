"""``@client.locked("report:{user_id}")``: run every call of a coroutine function under a lock."""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._lock import Lock

__all__ = ["LockedDecorator"]

P = ParamSpec("P")
R = TypeVar("R")


class LockedDecorator:
    def __init__(self, key: str | Callable[..., str], lock: Callable[[str], Lock]) -> None:
        if not isinstance(key, str) and not callable(key):
            raise ConfigurationError(
                f"the lock key must be a str template or a callable, got {key!r}"
            )
        if isinstance(key, str) and not key:
            raise ConfigurationError("the lock key template must not be empty")
        self._key = key
        self._lock = lock
        lock("validation")  # (the options are checked now, not at the first call)

    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError(
                f"@locked needs an async def function, {getattr(func, '__qualname__', func)!r} "
                f"is not one"
            )
        signature = inspect.signature(func)
        key = self._key
        if isinstance(key, str):
            _check_template(key, signature, func)
        lock = self._lock

        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if isinstance(key, str):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                try:
                    name = key.format_map(bound.arguments)
                except (KeyError, AttributeError, IndexError, ValueError) as exc:
                    raise ConfigurationError(
                        f"cannot format the lock key {key!r} from the arguments of "
                        f"{func.__qualname__}: {exc!r}"
                    ) from exc
            else:
                name = key(*args, **kwargs)
            async with lock(name):
                return await func(*args, **kwargs)

        return wrapper


def _check_template(
    template: str, signature: inspect.Signature, func: Callable[..., Any], text: str = ""
) -> None:
    """Check every field of ``text`` (the template, or a format spec nested in it)."""
    try:
        parsed = list(string.Formatter().parse(text or template))
    except ValueError as exc:
        raise ConfigurationError(f"bad lock key template {template!r}: {exc}") from exc
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if conversion not in (None, "r", "s", "a"):
            raise ConfigurationError(
                f"bad lock key template {template!r}: unknown conversion '!{conversion}' "
                f"(use !r, !s or !a)"
            )
        head = field.split(".", 1)[0].split("[", 1)[0]
        if not head or head.isdigit():
            raise ConfigurationError(
                f"lock key template {template!r}: use parameter names, not positions "
                f"(e.g. '{{user_id}}')"
            )
        if head not in signature.parameters:
            raise ConfigurationError(
                f"lock key template {template!r} names {head!r}, which is not a parameter of "
                f"{func.__qualname__}{signature}"
            )
        if spec:
            _check_template(template, signature, func, spec)
