"""Percentiles for the demo's report and for the benchmarks (``benchmarks/stats.py``).

One definition serves both: **linear interpolation between the closest ranks** (numpy's
default, ``method="linear"``), the one the recorded benchmark results were computed with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of sorted values, linear between closest ranks.

    None when there are no values.
    """
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = rank - low
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction)
