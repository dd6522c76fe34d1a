"""The generation loop over a ModelRunner: greedy as the runner's own, stopping at end
ids or the token limit, streaming each step, timing, and every block back on errors."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.runner.sampling import SamplingParams
from slotwise_engine.serving.generation import Completion, generate, generate_token_ids

PROMPTS = [[1, 2, 3], [5], [42, 11, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
STEPS = 8


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    return ModelRunner(model, num_blocks=32)


@pytest.fixture(scope="module")
def greedy(runner) -> list[list[int]]:
    return generate_token_ids(runner, PROMPTS, STEPS)


def test_greedy_generation_is_the_runners_own(runner, greedy):
    completions = generate(runner, PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    assert [c.token_ids for c in completions] == greedy
    assert [c.prompt_token_ids for c in completions] == PROMPTS
    assert all(c.finish_reason == "length" for c in completions)
    assert runner.allocator.num_free_blocks == 32


def test_a_request_stops_at_its_end_id_and_the_others_go_on(runner, greedy):
    eos = greedy[1][3]
    stop = greedy[1].index(eos) + 1
    completions = generate(runner, PROMPTS, max_new_tokens=STEPS, eos_token_ids={eos})
    assert completions[1].token_ids == greedy[1][:stop]  # the end id included
    assert completions[1].finish_reason == "stop"
    for completion, tokens in zip(completions, greedy, strict=True):
        cut = tokens.index(eos) + 1 if eos in tokens else STEPS
        assert completion.token_ids == tokens[:cut]
    assert runner.allocator.num_free_blocks == 32
    ignored = generate(runner, PROMPTS, max_new_tokens=STEPS, eos_token_ids={eos}, ignore_eos=True)
    assert [c.token_ids for c in ignored] == greedy


def test_each_step_streams_the_new_tokens(runner, greedy):
    seen: list[list[tuple[int, int]]] = []

    def on_step(stepped: list[Completion]) -> None:
        seen.append([(c.index, c.token_ids[-1]) for c in stepped])

    eos = greedy[0][2]
    completions = generate(
        runner, PROMPTS, max_new_tokens=STEPS, eos_token_ids={eos}, on_step=on_step
    )
    assert len(seen) == max(len(c.token_ids) for c in completions)
    for completion in completions:
        streamed = [token for step in seen for index, token in step if index == completion.index]
        assert streamed == completion.token_ids


def test_timings(runner):
    (one,) = generate(runner, [[1, 2]], max_new_tokens=1)
    assert one.ttft_s > 0 and one.seconds == one.ttft_s and one.tokens_per_second is None
    (many,) = generate(runner, [[1, 2]], max_new_tokens=6, ignore_eos=True)
    assert 0 < many.ttft_s < many.seconds
    assert many.tokens_per_second == pytest.approx(5 / (many.seconds - many.ttft_s))


def test_seeded_sampling_repeats_and_mixes_with_greedy(runner, greedy):
    params = [
        SamplingParams(),
        SamplingParams(temperature=1.0, top_p=0.9, seed=7),
        SamplingParams(),
    ]
    first = generate(runner, PROMPTS, max_new_tokens=STEPS, sampling=params, ignore_eos=True)
    again = generate(runner, PROMPTS, max_new_tokens=STEPS, sampling=params, ignore_eos=True)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert first[0].token_ids == greedy[0] and first[2].token_ids == greedy[2]
    with pytest.raises(ValueError, match="2 sampling parameters for 3 prompts"):
        generate(runner, PROMPTS, max_new_tokens=2, sampling=params[:2])


def test_every_block_comes_back_on_errors(runner, greedy, monkeypatch):
    def broken(stepped: list[Completion]) -> None:
        if len(stepped[0].token_ids) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(runner, PROMPTS, max_new_tokens=STEPS, on_step=broken)
    assert runner.allocator.num_free_blocks == 32

    def lost(*args: object) -> torch.Tensor:
        raise RuntimeError("device lost")

    monkeypatch.setattr(runner, "step", lost)
    with pytest.raises(RuntimeError, match="device lost"):
        generate(runner, PROMPTS, max_new_tokens=STEPS)
    assert runner.allocator.num_free_blocks == 32
    monkeypatch.undo()
    assert [c.token_ids for c in generate(runner, PROMPTS, max_new_tokens=STEPS)] == greedy


def test_bad_batches_take_no_blocks(runner):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(runner, [[1], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens is 0"):
        generate(runner, [[1]], max_new_tokens=0)
    assert runner.allocator.num_free_blocks == 32
