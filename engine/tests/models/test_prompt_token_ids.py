"""Prompts given to the library: token ids must be ints (a float is refused, never
truncated), held in any sequence type: lists, tuples, ranges, numpy arrays and torch
tensors, one per prompt or a 2-D batch, all giving the tokens of plain lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slotwise.compilation import CompilationConfig
from slotwise.errors import SlotwiseError
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import TokenIdError, generate, generate_token_ids

PROMPTS = [[1, 2, 3, 4], [50, 40, 30, 20]]
STEPS = 4
BLOCKS = 16


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    return ModelRunner(model, num_blocks=BLOCKS)


@pytest.fixture(scope="module")
def from_lists(runner) -> list[list[int]]:
    return [c.token_ids for c in generate(runner, PROMPTS, max_new_tokens=STEPS)]


@pytest.mark.parametrize(
    "prompts",
    [
        pytest.param([tuple(p) for p in PROMPTS], id="tuples"),
        pytest.param(tuple(PROMPTS), id="tuple-of-lists"),
        pytest.param([range(1, 5), range(50, 19, -10)], id="ranges"),
        pytest.param([np.array(p) for p in PROMPTS], id="numpy-1d-each"),
        pytest.param(np.array(PROMPTS, dtype=np.int32), id="numpy-2d-int32"),
        pytest.param(np.array(PROMPTS, dtype=np.uint16), id="numpy-2d-uint16"),
        pytest.param([[np.int64(t) for t in p] for p in PROMPTS], id="numpy-scalars"),
        pytest.param([torch.tensor(p) for p in PROMPTS], id="torch-1d-each"),
        pytest.param(torch.tensor(PROMPTS, dtype=torch.int32), id="torch-2d-int32"),
        pytest.param([list(map(torch.tensor, p)) for p in PROMPTS], id="torch-scalars"),
        pytest.param((iter(p) for p in PROMPTS), id="generators"),
    ],
)
def test_any_sequence_of_int_ids_generates_what_lists_do(runner, from_lists, prompts):
    completions = generate(runner, prompts, max_new_tokens=STEPS)
    assert [c.token_ids for c in completions] == from_lists
    assert [c.prompt_token_ids for c in completions] == PROMPTS
    assert all(type(t) is int for c in completions for t in c.prompt_token_ids)
    assert runner.allocator.num_free_blocks == BLOCKS


def test_the_runners_greedy_generate_takes_arrays_too(runner, from_lists):
    assert generate_token_ids(runner, np.array(PROMPTS), STEPS) == from_lists


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([[1.7, 34.2]], "prompt 0 has 1.7 at position 0, a float"),
        ([[1, 2], [3, 4.0]], "prompt 1 has 4.0 at position 1, a float"),  # integral: still no
        (np.array([[1.0, 2.0]]), "prompt 0 has 1.0 at position 0, a float"),
        ([torch.tensor([3, 4]), torch.tensor([5.5])], "prompt 1 has 5.5 at position 0"),
        ([[1, True]], "prompt 0 has True at position 1, a bool"),
        ([torch.tensor([True, False])], "prompt 0 has True at position 0, a bool"),
        ([["7"]], "prompt 0 has '7' at position 0, a str"),
        ([[1, None]], "prompt 0 has None at position 1, a NoneType"),
    ],
)
def test_ids_that_are_not_ints_are_refused_naming_value_and_position(runner, prompts, message):
    with pytest.raises(TokenIdError, match=message) as error:
        generate(runner, prompts, max_new_tokens=STEPS)
    assert "token ids are ints" in str(error.value)
    assert isinstance(error.value, SlotwiseError) and isinstance(error.value, TypeError)
    assert runner.allocator.num_free_blocks == BLOCKS


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([1, 2, 3], r"prompt 0 is 1, not a sequence; pass a list of prompts, e\.g\. \[\[1, "),
        (torch.tensor([1, 2, 3]), "prompt 0 is 1, not a sequence"),
        (["hello"], r"prompt 0 is text \('hello'\); encode it into token ids first"),
        ("hello", r"prompts is text \('hello'\)"),
        (5, "prompts is 5, not a sequence"),
    ],
)
def test_prompts_that_are_not_sequences_of_ids_say_what_to_pass(runner, prompts, message):
    with pytest.raises(TokenIdError, match=message):
        generate(runner, prompts, max_new_tokens=STEPS)
    assert runner.allocator.num_free_blocks == BLOCKS
