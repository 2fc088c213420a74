"""The percentile of the demo's report and the benchmarks: linear interpolation between the
closest ranks (numpy's default), as the recorded benchmark results were computed."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = (len(sorted_values) - 1) * q / 100.0
    low, high = math.floor(rank), min(math.floor(rank) + 1, len(sorted_values) - 1)
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low))
