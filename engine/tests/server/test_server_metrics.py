"""The /metrics exposition: Prometheus' text format, as a scraper parses it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from slotwise_engine.server.metrics import Counter, Gauge, Histogram, ServerMetrics, exposition
from slotwise_engine.serving.engine import StepTotals


@dataclass
class Load:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    num_preemptions: int = 0
    step_totals: dict[str, StepTotals] = field(default_factory=dict)


def samples(text: str) -> dict[str, float]:
    """name{labels} -> value of every sample line (what a scraper reads)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_each_kind_has_help_type_and_escaped_labels():
    labels = {"model_name": 'a "b"\\c\nd'}
    counter = Counter("x_total", "Things\ncounted.", labels, by="reason")
    counter.inc(key="stop")
    counter.inc(2, key="length")
    gauge = Gauge("y", "A level.", labels)
    gauge.set(0.25)
    text = exposition([counter, gauge])
    assert text == (
        "# HELP x_total Things\\ncounted.\n"
        "# TYPE x_total counter\n"
        'x_total{model_name="a \\"b\\"\\\\c\\nd",reason="length"} 2.0\n'
        'x_total{model_name="a \\"b\\"\\\\c\\nd",reason="stop"} 1.0\n'
        "# HELP y A level.\n"
        "# TYPE y gauge\n"
        'y{model_name="a \\"b\\"\\\\c\\nd"} 0.25\n'
    )


def test_counter_refuses_to_decrease():
    with pytest.raises(ValueError, match="cannot decrease"):
        Counter("x_total", "x", {}).inc(-1)


def test_histogram_buckets_are_cumulative_with_inf_sum_and_count():
    histogram = Histogram("t_seconds", "Times.", {"m": "n"}, buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.lines() == [
        't_seconds_bucket{m="n",le="0.1"} 2',
        't_seconds_bucket{m="n",le="1.0"} 3',
        't_seconds_bucket{m="n",le="+Inf"} 4',
        f't_seconds_sum{{m="n"}} {0.05 + 0.1 + 0.5 + 3.0!r}',
        't_seconds_count{m="n"} 4',
    ]


def test_histogram_refuses_unsorted_buckets():
    with pytest.raises(ValueError, match="increase strictly"):
        Histogram("t", "t", {}, buckets=(1.0, 0.5))


def test_server_metrics_follow_a_request_and_the_engine_load():
    metrics = ServerMetrics("tiny")
    timer = metrics.track(arrival=10.0)
    timer.admitted(7)
    timer.admitted(7)  # a request's prompt counts once
    timer.tokens(1, now=10.5)  # first token: time to first token 0.5 s
    timer.tokens(2, now=10.9)  # two tokens in 0.4 s: two gaps of 0.2 s
    timer.close("length", now=11.0)
    timer.close("abort", now=12.0)  # closed once
    steps = {"decode": StepTotals(3, 0.03, 12, 400), "mixed": StepTotals(1, 0.5, 2, 256)}
    values = samples(metrics.render(Load(3, 2, 5, 20, 4, steps)))
    label = '{model_name="tiny"}'
    assert values[f"slotwise_num_requests_running{label}"] == 3
    assert values[f"slotwise_num_requests_waiting{label}"] == 2
    assert values[f"slotwise_kv_cache_usage{label}"] == 0.25
    assert values[f"slotwise_num_preemptions_total{label}"] == 4
    assert values[f"slotwise_prompt_tokens_total{label}"] == 7
    decode = '{model_name="tiny",kind="decode"}'
    assert values[f"slotwise_engine_steps_total{decode}"] == 3
    assert values[f"slotwise_engine_step_seconds_total{decode}"] == 0.03
    assert values[f"slotwise_engine_step_requests_total{decode}"] == 12
    assert values[f"slotwise_engine_step_context_tokens_total{decode}"] == 400
    assert values['slotwise_engine_steps_total{model_name="tiny",kind="mixed"}'] == 1
    assert values[f"slotwise_generation_tokens_total{label}"] == 3
    length = 'slotwise_requests_finished_total{model_name="tiny",finished_reason="length"}'
    assert values[length] == 1
    assert 'finished_reason="abort"' not in metrics.render(Load())
    assert values[f"slotwise_time_to_first_token_seconds_count{label}"] == 1
    assert values[f"slotwise_time_to_first_token_seconds_sum{label}"] == 0.5
    assert values[f"slotwise_inter_token_latency_seconds_count{label}"] == 2
    assert math.isclose(values[f"slotwise_inter_token_latency_seconds_sum{label}"], 0.4)
    assert values[f"slotwise_e2e_request_latency_seconds_sum{label}"] == 1.0
    assert values['slotwise_e2e_request_latency_seconds_bucket{model_name="tiny",le="1.0"}'] == 1
    assert values['slotwise_e2e_request_latency_seconds_bucket{model_name="tiny",le="0.75"}'] == 0


def test_kv_use_of_an_empty_cache_is_zero():
    values = samples(ServerMetrics("m").render(Load(kv_blocks_total=0)))
    assert values['slotwise_kv_cache_usage{model_name="m"}'] == 0
