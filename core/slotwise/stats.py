"""Timings and their summary statistics, shared by ``slotwise bench`` and the benchmark
scripts.

Why here: both report p90s, and two definitions gave two answers for the same samples;
both time decode steps of several variants, and each had its own loop for it.
It imports neither torch nor the rest of slotwise, so a benchmark of start-up cost can
use it without disturbing what it measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)


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


def interleaved_timings(
    timers: Mapping[Key, Callable[[], float]], rounds: int, *, warmups: int = 0
) -> dict[Key, list[float]]:
    """Seconds of ``rounds`` timed calls of each timer (a call runs one step and returns its
    seconds), after ``warmups`` rounds that are not kept.

    The variants take turns round after round, so that a shared machine's noise hits
    them alike; and within its turn each variant runs one untimed call before the timed
    one.  A server runs one model step after step, and a step that follows another
    model's finds the caches full of that model's state: on a 2-vCPU AMD EPYC that cost
    0.3 to 0.7 ms on steps of 1.5 to 2.9 ms, more for the smaller model.
    """
    samples: dict[Key, list[float]] = {key: [] for key in timers}
    for round_index in range(warmups + rounds):
        for key, timer in timers.items():
            timer()  # untimed: the timed step follows its own model's
            seconds = timer()
            if round_index >= warmups:
                samples[key].append(seconds)
    return samples
