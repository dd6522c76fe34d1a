"""The engine's step counts by kind, which /metrics exports and benchmarks/serving.py
divides into batch sizes and step times: prompt chunks make a step "mixed", a step of
the one token each request sampled last is a "decode" step."""

from __future__ import annotations

from serving_support import drain, tiny_runner

from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.request_params import RequestParams


def test_steps_are_counted_by_kind_with_their_requests_and_context():
    engine = LLMEngine(tiny_runner(), max_num_batched_tokens=8)
    params = RequestParams(max_tokens=4, ignore_eos=True)
    engine.add_request("a", [1, 2, 3], params)
    engine.add_request("b", [5], params)
    assert all(t.steps == 0 for t in engine.stats().step_totals.values())
    drain(engine)
    totals = engine.stats().step_totals
    # step 1 prefills both prompts (3 + 1 tokens of context) and samples each one token
    mixed = totals["mixed"]
    assert (mixed.steps, mixed.requests, mixed.context_tokens) == (1, 2, 4)
    # steps 2 to 4 decode both: contexts (4, 2), (5, 3), (6, 4)
    decode = totals["decode"]
    assert (decode.steps, decode.requests, decode.context_tokens) == (3, 6, 24)
    assert decode.seconds > 0 and mixed.seconds > 0
    # a copy: what the caller holds does not change with later steps
    engine.add_request("c", [7], params)
    drain(engine)
    assert totals["decode"].steps == 3
    # a one-token prompt is still a prompt: its step is mixed
    later = engine.stats().step_totals
    assert (later["mixed"].steps, later["decode"].steps) == (2, 6)
