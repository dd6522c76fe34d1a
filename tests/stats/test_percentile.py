"""``slotwise.stats.percentile``: the one percentile of ``slotwise bench`` and benchmarks/.

The definition is numpy's default (linear interpolation between ranks), checked here
against numpy itself and against values worked out by hand.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy
import pytest

from slotwise.stats import percentile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size", [1, 2, 3, 10, 31])
@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_equals_numpy_percentile(size, q):
    rng = random.Random(size)
    values = [rng.uniform(-5, 5) for _ in range(size)]
    assert percentile(values, q) == pytest.approx(numpy.percentile(values, q), abs=1e-12)


def test_hand_computed_values():
    # Sorted 1, 2, 3, 4: p90 sits at position 0.9 * 3 = 2.7, between 3 and 4.
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # the median
    assert percentile([7.0], 90) == 7.0


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_rejects_no_values_and_q_outside_0_to_100(values, q):
    with pytest.raises(ValueError):
        percentile(values, q)


def test_the_benchmark_scripts_use_the_same_function():
    spec = importlib.util.spec_from_file_location("common", ROOT / "benchmarks" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    assert common.percentile is percentile
