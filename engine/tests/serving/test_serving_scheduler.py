"""The scheduler's decisions, seen through an engine over a tiny model: decodes first,
the token budget, max_num_seqs, chunked prefill beside decodes, blocks taken as
requests grow, preemption of the last admitted, aborts, and every block back at the end."""

from __future__ import annotations

import pytest
from serving_support import drain, finished, record_steps, run_alone, tiny_runner

from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.errors import RequestError, SchedulerStalledError
from slotwise_engine.serving.request_params import RequestParams

GREEDY_8 = RequestParams(max_tokens=8, ignore_eos=True)


def batch(step) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in zip(step.requests, step.num_tokens, strict=True)]


def test_a_long_prompt_is_prefilled_in_chunks_beside_the_running_decodes(monkeypatch):
    engine = LLMEngine(tiny_runner(), max_num_batched_tokens=8)
    steps = record_steps(engine, monkeypatch)
    short, long = [1, 2, 3], list(range(10, 30))
    engine.add_request("short", short, RequestParams(max_tokens=10, ignore_eos=True))
    engine.step()
    engine.add_request("long", long, GREEDY_8)
    stepped = [engine.step() for _ in range(3)]
    # The long prompt's first token comes from the step of its last chunk.
    assert [[o.request_id for o in outputs] for outputs in stepped] == [
        ["short"],
        ["short"],
        ["short", "long"],
    ]
    outputs = [o for outputs in stepped for o in outputs] + drain(engine)
    assert batch(steps[0]) == [("short", 3)]
    # Decodes first, the prompt's chunks in what is left of the budget: 7 + 7 + 6.
    assert [batch(s) for s in steps[1:5]] == [
        [("short", 1), ("long", 7)],
        [("short", 1), ("long", 7)],
        [("short", 1), ("long", 6)],
        [("short", 1), ("long", 1)],
    ]
    assert all(s.total_tokens <= 8 for s in steps)
    results = finished(outputs)
    assert results["short"].token_ids == run_alone(short, RequestParams(max_tokens=10))
    assert results["long"].token_ids == run_alone(long, GREEDY_8)
    assert engine.stats().kv_blocks_used == 0


def test_the_token_budget_and_max_num_seqs_bound_every_step(monkeypatch):
    engine = LLMEngine(tiny_runner(), max_num_seqs=2, max_num_batched_tokens=6)
    steps = record_steps(engine, monkeypatch)
    prompts = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9, 10]}
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, RequestParams(max_tokens=3, ignore_eos=True))
    outputs = drain(engine)
    assert batch(steps[0]) == [("a", 4), ("b", 2)]  # "b" gets what is left of the budget
    assert batch(steps[1]) == [("a", 1), ("b", 2)]
    assert all(len(s.requests) <= 2 and s.total_tokens <= 6 for s in steps)
    # "c" waits for a place: it starts once "a" has finished.
    first_c = next(i for i, s in enumerate(steps) if "c" in [r.request_id for r in s.requests])
    last_a = max(i for i, s in enumerate(steps) if "a" in [r.request_id for r in s.requests])
    assert first_c > last_a
    for request_id, output in finished(outputs).items():
        assert output.token_ids == run_alone(prompts[request_id], RequestParams(max_tokens=3))


def test_blocks_are_taken_as_a_request_grows_and_all_come_back():
    engine = LLMEngine(tiny_runner())
    engine.add_request("r", [1, 2, 3], RequestParams(max_tokens=40, ignore_eos=True))
    used = []
    while engine.has_unfinished():
        engine.step()
        used.append(engine.stats().kv_blocks_used)
    # 3 prompt tokens and 39 decoded: 1 block until token 17 is computed, 3 from token 33.
    assert used[:13] == [1] * 13 and used[14:29] == [2] * 15 and used[30:-1] == [3] * 9
    assert used[-1] == 0


def test_the_last_admitted_request_is_preempted_and_recomputed_to_the_same_tokens(monkeypatch):
    params = RequestParams(max_tokens=30, ignore_eos=True)
    prompts = {"first": list(range(1, 21)), "second": list(range(50, 70))}
    # 4 blocks of 16: each request (50 tokens) fits alone, both together do not.
    engine = LLMEngine(tiny_runner(num_blocks=4))
    steps = record_steps(engine, monkeypatch)
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params)
    outputs = drain(engine)
    preempted = [r.request_id for s in steps for r in s.preempted]
    assert preempted and set(preempted) == {"second"}
    assert engine.stats().num_preemptions == len(preempted)
    results = finished(outputs)
    for request_id, prompt in prompts.items():
        assert results[request_id].token_ids == run_alone(prompt, params)
        assert results[request_id].finish_reason == "length"
    assert engine.stats().kv_blocks_used == 0


def test_many_requests_on_a_small_cache_all_finish_as_if_alone():
    params = RequestParams(max_tokens=12, ignore_eos=True)
    prompts = {str(i): [i + 1] * (5 + 7 * i) for i in range(6)}
    engine = LLMEngine(tiny_runner(num_blocks=5), max_num_batched_tokens=16)
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params)
    results = finished(drain(engine))
    assert engine.stats().num_preemptions > 0
    assert {k: v.token_ids for k, v in results.items()} == {
        k: run_alone(p, params) for k, p in prompts.items()
    }
    assert engine.stats().kv_blocks_used == 0


def test_a_request_the_whole_cache_cannot_hold_is_refused_up_front():
    engine = LLMEngine(tiny_runner(num_blocks=2))
    with pytest.raises(RequestError, match="over the 32 tokens the whole KV cache holds"):
        engine.add_request("big", [1] * 20, RequestParams(max_tokens=13))
    assert not engine.has_unfinished()
    engine.add_request("fits", [1] * 20, RequestParams(max_tokens=12, ignore_eos=True))
    assert len(finished(drain(engine))["fits"].token_ids) == 12


def test_a_cache_taken_behind_the_schedulers_back_stops_with_an_error_not_a_hang():
    runner = tiny_runner(num_blocks=4)
    engine = LLMEngine(runner)
    engine.add_request("r", [1] * 20, RequestParams(max_tokens=4))
    taken = runner.allocator.allocate(4 * 16)  # another user of the runner's cache
    with pytest.raises(
        SchedulerStalledError, match="1 requests wait but none fits the 0 free cache blocks"
    ):
        engine.step()
    runner.allocator.free(taken)
    assert not engine.has_unfinished() and engine.stats().kv_blocks_used == 0


def test_an_abort_at_any_step_returns_the_blocks_at_once(monkeypatch):
    engine = LLMEngine(tiny_runner(), max_num_seqs=2, max_num_batched_tokens=8)
    params = RequestParams(max_tokens=20, ignore_eos=True)
    engine.add_request("decoding", [1, 2, 3], params)
    engine.add_request("prefilling", list(range(40)), params)
    engine.add_request("waiting", [4, 5], params)
    engine.step()
    engine.step()
    assert engine.stats().num_running == 2 and engine.stats().num_waiting == 1
    used = engine.stats().kv_blocks_used
    engine.abort("prefilling")  # halfway through its prompt
    assert engine.stats().kv_blocks_used == used - 1
    engine.abort("waiting")
    engine.abort("unknown")  # no-op
    outputs = engine.step()
    aborted = {o.request_id: o for o in outputs if o.finish_reason == "abort"}
    assert set(aborted) == {"prefilling", "waiting"} and all(o.finished for o in aborted.values())
    engine.abort("decoding")
    assert engine.stats().kv_blocks_used == 0
    assert [o.finish_reason for o in engine.step()] == ["abort"]
    assert not engine.has_unfinished()
    engine.abort("decoding")  # finished: no-op
    assert engine.step() == []


def test_running_requests_keep_their_place_and_runner_request_when_one_joins(monkeypatch):
    """The runner keeps a request's block-table row while it holds the same place in the
    batch: a joining request only adds rows after the running ones."""
    engine = LLMEngine(tiny_runner())
    steps = record_steps(engine, monkeypatch)
    params = RequestParams(max_tokens=6, ignore_eos=True)
    for request_id in "abc":
        engine.add_request(request_id, [1, 2, 3], params)
    engine.step()
    engine.step()
    engine.add_request("joins", [4, 5, 6, 7], params)
    engine.step()
    before, after = steps[1], steps[2]
    assert [r.request_id for r in after.requests] == ["a", "b", "c", "joins"]
    assert all(
        x.runner_request is y.runner_request
        for x, y in zip(after.requests[:3], before.requests, strict=True)
    )
