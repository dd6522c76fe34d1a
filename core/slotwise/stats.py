"""Summary statistics of timings, shared by ``slotwise bench`` and the benchmark scripts.

Why here: both report p90s, and two definitions gave two answers for the same samples.
It imports neither torch nor the rest of slotwise, so a benchmark of start-up cost can
use it without disturbing what it measures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated between ranks.

    The definition of ``numpy.percentile``'s default (method "linear"): position
    ``(n - 1) * q / 100`` in the sorted values, so 50 is the median, 0 the minimum and
    100 the maximum.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
