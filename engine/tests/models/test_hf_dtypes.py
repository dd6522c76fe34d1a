"""Loading a checkpoint in another dtype than it was saved in.

bfloat16 keeps 8 bits of mantissa (a relative error of 2^-9 per rounding), so a
float32 checkpoint run in bfloat16 cannot match float32 logits to float32 noise.
The stated tolerance: every logit within 0.3 standard deviations of the float32
logits' spread (these logits have a spread of about 2.4, so about 0.7; measured
errors are at most 0.5), and the same top token after the prompt.  The other way,
a bfloat16 checkpoint upcast to float32 is exact, so its logits match transformers'
float32 logits of the same bfloat16 weights to float32 noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_checkpoints import make_checkpoint, reference_logits

from slotwise_engine.models import load_model
from slotwise_engine.runner.model_runner import ModelRunner

PROMPTS = [[12, 5, 9], list(range(100, 124)), [299, 0, 1, 2, 3, 4, 5]]
LEVEL0 = {"level": 0}
BF16_SPREADS = 0.3


def last_prompt_logits(folder: Path, **options) -> tuple[torch.nn.Module, torch.Tensor]:
    model = load_model(folder, compilation_config=LEVEL0, **options)
    runner = ModelRunner(model, num_blocks=64)
    sequences = runner.add_requests(PROMPTS, 1)
    return model, runner.step(sequences)


@pytest.fixture(scope="module")
def float32_checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama-bias-linear", tmp_path_factory.mktemp("f32"))


@pytest.fixture(scope="module")
def bfloat16_checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("qwen2", tmp_path_factory.mktemp("bf16"), dtype=torch.bfloat16)


def test_a_float32_checkpoint_runs_in_bfloat16_within_the_stated_tolerance(float32_checkpoint):
    model, logits = last_prompt_logits(float32_checkpoint, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    references = reference_logits(float32_checkpoint, PROMPTS)
    for prompt, ours, theirs in zip(PROMPTS, logits, references, strict=True):
        expected = theirs[len(prompt) - 1]
        assert (ours - expected).abs().max() < BF16_SPREADS * expected.std()
        assert ours.argmax() == expected.argmax()


def test_a_bfloat16_checkpoint_loads_in_its_own_dtype_by_default(bfloat16_checkpoint):
    model = load_model(bfloat16_checkpoint, compilation_config=LEVEL0)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_a_bfloat16_checkpoint_upcast_to_float32_matches_transformers(bfloat16_checkpoint):
    model, logits = last_prompt_logits(bfloat16_checkpoint, dtype="float32")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    references = reference_logits(bfloat16_checkpoint, PROMPTS)
    for prompt, ours, theirs in zip(PROMPTS, logits, references, strict=True):
        torch.testing.assert_close(ours, theirs[len(prompt) - 1], atol=2e-4, rtol=2e-4)
