"""Small statistics helpers (no numpy).

:func:`percentile` is the library's own (:mod:`aiodlock.cli._stats`, which the ``aiodlock
demo`` report uses too): linear interpolation between the closest ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aiodlock.cli._stats import percentile

__all__ = ["percentile", "summary_ms", "time_weighted_percentile"]


def summary_ms(seconds: Iterable[float]) -> dict[str, float | int | None]:
    """Count, p50, p90, p99 and max of durations given in seconds, reported in milliseconds."""
    values = sorted(seconds)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000.0, 4)

    return {
        "n": len(values),
        "p50_ms": ms(percentile(values, 50)),
        "p90_ms": ms(percentile(values, 90)),
        "p99_ms": ms(percentile(values, 99)),
        "max_ms": ms(values[-1] if values else None),
    }


def time_weighted_percentile(values: Sequence[float], q: float) -> float | None:
    """The wait ``w`` such that ``q`` % of all the time spent waiting was in waits <= ``w``.

    A per-sample percentile counts a worker starved for the whole run once, next to
    thousands of instant re-acquisitions by the releaser; weighting each wait by its
    length shows where the waiting time actually goes.
    """
    ordered = sorted(values)
    total = sum(ordered)
    if not ordered or total <= 0:
        return None
    threshold = total * q / 100.0
    running = 0.0
    for value in ordered:
        running += value
        if running >= threshold:
            return float(value)
    return float(ordered[-1])
