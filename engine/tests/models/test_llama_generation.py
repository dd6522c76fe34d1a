"""The Llama model through the ModelRunner: same greedy tokens at every level."""

from __future__ import annotations

import pytest
import torch

from slotwise.attention.ops import UNIFIED_ATTENTION_OP
from slotwise.compilation import CompilationConfig, counters
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

PROMPTS = [[1, 5, 9, 3], [7, 7, 2], [42, 11, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]


def generate(config, max_new_tokens: int = 6) -> list[list[int]]:
    model = build_llama("tiny", seed=0, compilation_config=config)
    return generate_token_ids(ModelRunner(model, num_blocks=32), PROMPTS, max_new_tokens)


@pytest.fixture(scope="module")
def eager_tokens() -> list[list[int]]:
    return generate(CompilationConfig(level=0))


def test_level_three_with_the_eager_compiler_generates_the_eager_tokens(eager_tokens):
    """The CPU platform compiles the model as one graph (it has no static graphs to
    split for): the attention op runs inside it, on prefills and decodes alike."""
    with counters.expect(
        num_graphs_seen=1, num_piecewise_graphs_seen=1, num_piecewise_capturable_graphs_seen=1
    ):
        tokens = generate(CompilationConfig(level=3, backend="eager"))
    assert tokens == eager_tokens


def test_level_three_split_at_attention_generates_the_eager_tokens(eager_tokens):
    layers = PRESETS["tiny"].num_layers
    split = CompilationConfig(level=3, backend="eager", splitting_ops=[UNIFIED_ATTENTION_OP])
    with counters.expect(
        num_graphs_seen=1,
        num_piecewise_graphs_seen=2 * layers + 1,
        num_piecewise_capturable_graphs_seen=layers + 1,
    ):
        tokens = generate(split)
    assert tokens == eager_tokens


@pytest.mark.slow
def test_level_three_with_inductor_generates_the_eager_tokens(eager_tokens, tmp_path):
    config = CompilationConfig(level=3, backend="inductor", cache_dir=str(tmp_path))
    assert generate(config) == eager_tokens


def test_generation_is_deterministic_and_depends_on_the_seed(eager_tokens):
    assert generate(CompilationConfig(level=0)) == eager_tokens
    other = build_llama("tiny", seed=1, compilation_config=CompilationConfig(level=0))
    assert generate_token_ids(ModelRunner(other, num_blocks=32), PROMPTS, 6) != eager_tokens


def test_presets_have_the_advertised_sizes():
    with torch.device("meta"):
        small = build_llama("small", compilation_config=CompilationConfig(level=0), device="meta")
    assert 25e6 < small.num_parameters() < 35e6
    assert PRESETS["1b"].num_layers == 16
    assert PRESETS["1b"].head_size == 64
    with pytest.raises(ValueError, match="unknown preset 'huge'.*tiny"):
        build_llama("huge")


def test_blocks_are_returned_after_generation():
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    runner = ModelRunner(model, num_blocks=32)
    free = runner.allocator.num_free_blocks
    generate_token_ids(runner, PROMPTS, 3)
    assert runner.allocator.num_free_blocks == free


def test_requests_longer_than_the_model_are_refused_before_they_run():
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    runner = ModelRunner(model, num_blocks=64)
    assert runner.max_model_len == PRESETS["tiny"].max_position
    with pytest.raises(
        ValueError, match="prompt 1 has 500 tokens .* 20 more, over max_model_len 512"
    ):
        runner.add_requests([[1] * 4, [1] * 500], 20)
    assert runner.allocator.num_free_blocks == 64  # nothing reserved
