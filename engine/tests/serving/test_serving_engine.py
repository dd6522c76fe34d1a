"""What LLMEngine's users see: outputs of requests joining at any step equal to each
run alone, stopping rules, seeded sampling independent of the batch, incremental text,
timings and the requests it refuses."""

from __future__ import annotations

import pytest
from serving_support import (
    byte_tokenizer,
    drain,
    finished,
    force_tokens,
    run_alone,
    scripted,
    tiny_runner,
)

from slotwise_engine.serving.engine import LLMEngine
from slotwise_engine.serving.errors import RequestError
from slotwise_engine.serving.request_params import RequestParams

PROMPTS = {"a": [1, 2, 3], "b": [5], "c": [42, 11, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}


def test_greedy_requests_joining_at_different_steps_get_their_tokens_alone():
    params = RequestParams(max_tokens=10, ignore_eos=True)
    engine = LLMEngine(tiny_runner(), max_num_batched_tokens=8)
    outputs = []
    for join_at, request_id in ((0, "a"), (2, "b"), (5, "c")):
        while len([o for o in outputs if o.request_id == "a"]) < join_at:
            outputs += engine.step()
        engine.add_request(request_id, PROMPTS[request_id], params)
    outputs += drain(engine)
    results = finished(outputs)
    for request_id, prompt in PROMPTS.items():
        assert results[request_id].token_ids == run_alone(prompt, params)
        streamed = [t for o in outputs if o.request_id == request_id for t in o.new_token_ids]
        assert streamed == results[request_id].token_ids
    assert engine.stats().kv_blocks_used == 0


def test_seeded_sampling_gives_the_same_tokens_in_any_batch():
    seeded = RequestParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=7, ignore_eos=True)
    alone = run_alone(PROMPTS["a"], seeded)
    assert alone == run_alone(PROMPTS["a"], seeded)
    assert alone != run_alone(PROMPTS["a"], RequestParams(max_tokens=12, ignore_eos=True))
    engine = LLMEngine(tiny_runner(), max_num_batched_tokens=6)
    engine.add_request("greedy", PROMPTS["c"], RequestParams(max_tokens=12, ignore_eos=True))
    other = RequestParams(max_tokens=5, temperature=0.7, top_k=20, seed=1, ignore_eos=True)
    engine.add_request("other", PROMPTS["b"], other)
    outputs = engine.step() + engine.step()
    engine.add_request("seeded", PROMPTS["a"], seeded)
    results = finished(outputs + drain(engine))
    assert results["seeded"].token_ids == alone
    assert results["greedy"].token_ids == run_alone(
        PROMPTS["c"], RequestParams(max_tokens=12, ignore_eos=True)
    )


def test_max_tokens_ends_with_length_and_eos_with_stop_unless_ignored(monkeypatch):
    runner = tiny_runner()
    force_tokens(runner, monkeypatch, scripted([1, 2], [7, 8, 9, 10, 11, 12]))
    engine = LLMEngine(runner, eos_token_ids={9})
    engine.add_request("eos", [1, 2], RequestParams(max_tokens=5))
    engine.add_request("ignore", [1, 2], RequestParams(max_tokens=5, ignore_eos=True))
    engine.add_request("short", [1, 2], RequestParams(max_tokens=2))
    engine.add_request("stop-id", [1, 2], RequestParams(max_tokens=5, stop_token_ids=(8,)))
    results = finished(drain(engine))
    assert (results["eos"].token_ids, results["eos"].finish_reason) == ([7, 8, 9], "stop")
    assert results["ignore"].token_ids == [7, 8, 9, 10, 11]
    assert results["ignore"].finish_reason == "length"
    assert (results["short"].token_ids, results["short"].finish_reason) == ([7, 8], "length")
    assert (results["stop-id"].token_ids, results["stop-id"].finish_reason) == ([7, 8], "stop")


def test_a_stop_string_across_tokens_ends_the_text_before_it(monkeypatch):
    tokenizer = byte_tokenizer()
    text, stop = "Say: Grüße aus 日本 🙂 and STO, then ", "STOP"
    rest = tokenizer.encode(text + "STOP!!! more", add_special_tokens=False)
    runner = tiny_runner()
    prompt = tokenizer.encode("Hi")
    force_tokens(runner, monkeypatch, scripted(prompt, rest))
    engine = LLMEngine(runner, tokenizer=tokenizer)
    engine.add_request("s", "Hi", RequestParams(max_tokens=60, stop=("never", stop)))
    outputs = drain(engine)
    last = outputs[-1]
    assert (last.finished, last.finish_reason) == (True, "stop")
    assert last.text == text
    assert "".join(o.new_text for o in outputs) == text
    # The token that completed "STOP" is the last one; the text never showed its start
    # early, and "STO," went out once the comma told it was no stop string.
    assert last.token_ids == rest[: len(tokenizer.encode(text + stop, add_special_tokens=False))]
    assert all(not o.text.endswith(("S", "ST", "STO")) for o in outputs)
    assert any(o.text.endswith("STO,") for o in outputs)
    assert all("\ufffd" not in o.new_text for o in outputs)


def test_incremental_text_equals_decoding_all_tokens_at_once(monkeypatch):
    tokenizer = byte_tokenizer()
    continuation = tokenizer.encode(
        "Grüße, Ça va? 日本語のテキスト 🙂🙂 end", add_special_tokens=False
    )
    runner = tiny_runner()
    force_tokens(runner, monkeypatch, scripted([1, 2, 3], continuation))
    engine = LLMEngine(runner, tokenizer=tokenizer)
    engine.add_request("t", [1, 2, 3], RequestParams(max_tokens=len(continuation)))
    outputs = drain(engine)
    pieces = [o.new_text for o in outputs]
    assert "".join(pieces) == tokenizer.decode(continuation) == outputs[-1].text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # some tokens end inside a character: their text waits
    # Random tokens too: what the engine streams is what decoding them all gives.
    engine = LLMEngine(tiny_runner(), tokenizer=tokenizer)
    engine.add_request("r", [1, 2, 3], RequestParams(max_tokens=40, ignore_eos=True))
    outputs = drain(engine)
    assert "".join(o.new_text for o in outputs) == tokenizer.decode(outputs[-1].token_ids)


def test_outputs_carry_the_request_and_its_times():
    engine = LLMEngine(tiny_runner())
    engine.add_request("t", [1, 2, 3], RequestParams(max_tokens=3, ignore_eos=True))
    outputs = drain(engine)
    assert [o.finished for o in outputs] == [False, False, True]
    assert [len(o.token_ids) for o in outputs] == [1, 2, 3]
    last = outputs[-1]
    assert last.prompt_token_ids == [1, 2, 3] and last.text == ""
    assert last.arrival_time < last.first_token_time <= last.finished_time
    assert outputs[0].finished_time is None


@pytest.mark.parametrize(
    "request_id, prompt, params, message",
    [
        ("e", [], RequestParams(), "the prompt is empty"),
        ("v", [1, 256], RequestParams(), "token id 256, outside the vocabulary of 256"),
        ("f", [1, 2.0], RequestParams(), "the prompt has 2.0 at position 1"),
        ("l", [1] * 500, RequestParams(max_tokens=13), "has 500 tokens and asks for 13 more"),
        ("t", "text", RequestParams(), "the prompt is text, but the engine has no tokenizer"),
        ("s", [1], RequestParams(stop=("x",)), "stop strings need the engine's tokenizer"),
        ("dup", [1], RequestParams(), "request id 'dup' is in use"),
    ],
)
def test_bad_requests_are_refused_before_they_take_anything(request_id, prompt, params, message):
    engine = LLMEngine(tiny_runner())
    engine.add_request("dup", [1], RequestParams())
    with pytest.raises(RequestError, match=message):
        engine.add_request(request_id, prompt, params)
    assert engine.stats().num_waiting == 1 and engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_tokens", 0, "max_tokens is 0"),
        ("temperature", -1.0, "temperature is -1.0"),
        ("temperature", float("nan"), "temperature is nan"),
        ("top_p", 0.0, "top_p is 0.0"),
        ("top_k", -1, "top_k is -1"),
        ("seed", 2**64, "seed is 18446744073709551616"),
        ("stop", "END", r"stop is 'END'; pass a list, e.g. \['END'\]"),
        ("stop", ("",), "stop holds ''"),
        ("stop_token_ids", (-1,), "stop_token_ids holds -1"),
    ],
)
def test_request_params_name_the_bad_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        RequestParams(**{field: value})
    assert RequestParams(stop=["a"], stop_token_ids=[1]).stop == ("a",)
