"""Layer 1: checks of what a caller passes in, each failing with a message naming it."""

from __future__ import annotations

import math

from ._errors import ConfigurationError

__all__ = ["MAX_NAME_LENGTH", "MAX_SECONDS", "check_name", "check_seconds"]

MAX_NAME_LENGTH = 512
#: The longest duration anything takes (a lease, a wait, a timeout): one year.  Longer ones
#: are refused here, not left to overflow a server's integer.
MAX_SECONDS = 365 * 24 * 3600.0


def check_name(name: object) -> str:
    """Validate a lock name (any non-empty str of at most 512 characters)."""
    if not isinstance(name, str):
        raise ConfigurationError(f"a lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ConfigurationError("a lock name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"a lock name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}"
        )
    return name


def check_seconds(what: str, value: object, *, allow_none: bool, positive: bool) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise ConfigurationError(f"{what} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{what} must be a number of seconds, got {value!r}")
    number = float(value)
    if math.isnan(number) or number < 0 or (positive and number == 0):
        bound = "greater than 0" if positive else "0 or more"
        raise ConfigurationError(f"{what} must be {bound}, got {value!r}")
    if math.isinf(number):
        raise ConfigurationError(f"{what} must be finite (None: no limit), got {value!r}")
    if number > MAX_SECONDS:
        raise ConfigurationError(
            f"{what} must be at most one year ({MAX_SECONDS:.0f} s), got {value!r}"
        )
    return number
