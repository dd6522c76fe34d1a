"""What the ModelRunner accepts: bad batches are refused before they take blocks or reach
the model, a refused batch leaves the runner as good as new, and batches may come in
any order."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.errors import RequestError
from slotwise_engine.serving.generation import generate_token_ids

PROMPTS = [[1, 5, 9, 3], [7, 7, 2]]
MIXED = [[1, 2, 3], [5], [42, 11, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [9]]


def runner(level: int = 0, num_blocks: int = 32) -> ModelRunner:
    config = CompilationConfig(level=level, backend="eager" if level else "")
    model = build_llama("tiny", seed=0, compilation_config=config)
    return ModelRunner(model, num_blocks=num_blocks)


@pytest.fixture(scope="module")
def eager_tokens() -> list[list[int]]:
    return generate_token_ids(runner(), PROMPTS, 4)


@pytest.mark.parametrize("bad_id", [256, -1])
def test_out_of_vocabulary_ids_are_refused_and_the_runner_stays_usable(eager_tokens, bad_id):
    r = runner()
    free = r.allocator.num_free_blocks
    with pytest.raises(
        ValueError, match=f"prompt 1 has token id {bad_id}, outside the vocabulary of 256"
    ):
        generate_token_ids(r, [[1, 2], [3, bad_id, 4]], 4)
    assert r.allocator.num_free_blocks == free
    assert generate_token_ids(r, PROMPTS, 4) == eager_tokens


def test_a_model_without_a_vocab_size_gets_no_id_check():
    r = runner()
    r.vocab_size = None  # as for a model without config.vocab_size
    with pytest.raises(IndexError):  # the model's own error: nothing stopped the id
        generate_token_ids(r, [[1000]], 1)


def test_a_batch_larger_than_the_cache_runs_in_turns_and_a_prompt_larger_is_refused(
    eager_tokens,
):
    r = runner(num_blocks=8)
    # 3 blocks of 16 per request: two fit at a time, the others wait for their blocks.
    prompts = [[token] * 40 for token in (1, 2, 3, 4)]
    alone = [generate_token_ids(runner(), [prompt], 2)[0] for prompt in prompts]
    assert generate_token_ids(r, prompts, 2) == alone
    assert r.allocator.num_free_blocks == 8
    with pytest.raises(RequestError, match="over the 128 tokens the whole KV cache holds"):
        generate_token_ids(r, [[1] * 120, [1]], 9)
    assert r.allocator.num_free_blocks == 8
    assert generate_token_ids(r, PROMPTS, 4) == eager_tokens


def test_a_failing_step_returns_its_blocks(eager_tokens, monkeypatch):
    r = runner()
    free = r.allocator.num_free_blocks

    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("device lost")

    monkeypatch.setattr(r, "_run", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        generate_token_ids(r, PROMPTS, 4)
    assert r.allocator.num_free_blocks == free
    monkeypatch.undo()
    assert generate_token_ids(r, PROMPTS, 4) == eager_tokens


def test_empty_batches_and_prompts_never_reach_the_compiled_model(eager_tokens):
    r = runner(level=3)
    free = r.allocator.num_free_blocks
    with pytest.raises(ValueError, match="no prompts"):
        generate_token_ids(r, [], 4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate_token_ids(r, [[1, 2], []], 4)
    with pytest.raises(ValueError, match="max_new_tokens is 0; ask for at least 1"):
        generate_token_ids(r, PROMPTS, 0)
    with pytest.raises(ValueError, match="step.. got no sequences"):
        r.step([])
    assert r.allocator.num_free_blocks == free
    assert generate_token_ids(r, PROMPTS, 4) == eager_tokens


def test_prompts_of_any_lengths_in_any_order_generate_as_if_alone():
    r = runner()
    alone = [generate_token_ids(r, [prompt], 5)[0] for prompt in MIXED]
    assert generate_token_ids(r, MIXED, 5) == alone
    assert generate_token_ids(r, MIXED[::-1], 5) == alone[::-1]


def test_step_orders_decodes_before_prefills_and_answers_in_the_callers_order():
    def logits(reverse: bool) -> torch.Tensor:
        r = runner()
        (decode,) = r.add_requests([[1, 2, 3]], 2)
        r.step([decode])
        decode.tokens.append(4)
        (prefill,) = r.add_requests([[5, 6, 7]], 2)
        return r.step([prefill, decode] if reverse else [decode, prefill])

    torch.testing.assert_close(logits(reverse=True), logits(reverse=False).flip(0))
