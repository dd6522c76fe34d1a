"""``dynamic`` (NTK) and ``yarn`` RoPE scaling give transformers' greedy tokens on
prompts that run past the original context, where the scaling matters."""

from __future__ import annotations

import pytest
import torch
from hf_checkpoints import edit_config, make_checkpoint, reference_greedy, run_steps

from slotwise_engine.models import load_model
from slotwise_engine.runner.model_runner import ModelRunner

pytest.importorskip("transformers")

LEVEL0 = {"level": 0}
NEW_TOKENS = 24


@pytest.mark.parametrize(
    "spec, prompt_length, context",
    [("llama-dynamic", 40, 128), ("llama-yarn", 48, 128)],
)
def test_scaled_rope_matches_transformers_past_the_original_context(
    spec, prompt_length, context, tmp_path
):
    folder = make_checkpoint(spec, tmp_path / spec)
    model = load_model(folder, compilation_config=LEVEL0)
    assert model.config.max_position == context
    prompt = torch.randint(3, 300, (prompt_length,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.tolist()
    expected = reference_greedy(folder, prompt, NEW_TOKENS)
    runner = ModelRunner(model, num_blocks=16)
    _, sequences = run_steps(runner, [prompt], NEW_TOKENS - 1)
    assert len(expected) > 8  # no early end-of-sequence: enough tokens to compare
    assert sequences[0][prompt_length:][: len(expected)] == expected[: NEW_TOKENS - 1]
    # The prompt is long enough for the scaling to matter: unscaled RoPE decodes otherwise.
    edit_config(folder, lambda c: c.update(rope_parameters={"rope_type": "default"}))
    assert reference_greedy(folder, prompt, NEW_TOKENS) != expected


def test_dynamic_scaling_changes_nothing_within_the_original_context(tmp_path):
    """Below max_position_embeddings the NTK base is the checkpoint's own."""
    folder = make_checkpoint("llama-dynamic", tmp_path / "dynamic")
    model = load_model(folder, compilation_config=LEVEL0)
    rope = model.model.rotary_emb
    positions = torch.arange(20)
    query = torch.randn(20, 64)
    exponents = torch.arange(0, 16, 2).float() / 16
    angles = positions.float()[:, None] / (10000.0**exponents)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    heads = query.view(20, 4, 16)
    first, second = heads.chunk(2, dim=-1)
    expected = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    rotated, _ = rope(positions, query, query[:, :32])
    torch.testing.assert_close(rotated.view(20, 4, 16), expected)
