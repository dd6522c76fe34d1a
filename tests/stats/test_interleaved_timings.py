"""``slotwise.stats.interleaved_timings``: how ``slotwise bench`` and benchmarks/ take turns.

What a reader of a benchmark relies on: the variants alternate round after round, each
timed call comes right after an untimed call of the same variant, and warm-up rounds
and untimed calls are not among the samples.
"""

from slotwise.stats import interleaved_timings


def recording_timers(names, calls):
    """Timers that log each call and return its position in the log as its 'seconds'."""

    def timer(name):
        def run():
            calls.append(name)
            return float(len(calls))

        return run

    return {name: timer(name) for name in names}


def test_each_timed_call_follows_an_untimed_call_of_its_own_variant():
    calls = []
    interleaved_timings(recording_timers(["a", "b", "c"], calls), rounds=2)
    assert calls == ["a", "a", "b", "b", "c", "c"] * 2


def test_samples_are_the_timed_calls_after_the_warmups():
    calls = []
    samples = interleaved_timings(recording_timers(["a", "b"], calls), rounds=3, warmups=2)
    assert len(calls) == 2 * 2 * (2 + 3)
    # Round r (0-based) has a's calls at 4r + 1, 4r + 2 and b's at 4r + 3, 4r + 4.
    assert samples == {"a": [10.0, 14.0, 18.0], "b": [12.0, 16.0, 20.0]}


def test_keys_keep_their_type_and_order():
    samples = interleaved_timings({(2, "x"): lambda: 0.5, (1, "y"): lambda: 0.25}, rounds=1)
    assert list(samples) == [(2, "x"), (1, "y")]
    assert samples[(1, "y")] == [0.25]


def test_no_rounds_gives_empty_samples():
    assert interleaved_timings({"a": lambda: 1.0}, rounds=0, warmups=1) == {"a": []}
