"""Checkpoints saved by transformers, loaded by slotwise: the same logits, step by step.

For each architecture spec, slotwise runs a prefill and 16 greedy decode steps
through the ModelRunner; transformers then runs each whole sequence (prompt and
slotwise's tokens) once, and since it is causal its row i is the logits after token
i.  Every step's logits must match to float32 noise and every greedy token must be
transformers' argmax, for one prompt and for a batch of prompts of other lengths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_checkpoints import SPECS, make_checkpoint, reference_logits, run_steps

from slotwise.compilation import CompilationConfig
from slotwise_engine.models import load_model
from slotwise_engine.runner.model_runner import ModelRunner

PROMPT = [1, 17, 250, 3, 99, 42, 7, 7, 180, 5, 64]
BATCH = [[12, 5, 9], list(range(100, 124)), [299, 0, 1, 2, 3, 4, 5]]
#: float32 noise: the two compute the same function in a different order.
ATOL = RTOL = 2e-4
DECODE_STEPS = 16

LEVELS = {
    "level0": CompilationConfig(level=0),
    "level3-eager": CompilationConfig(level=3, backend="eager"),
}


def assert_matches_transformers(folder: Path, prompts: list[list[int]], logits, tokens) -> None:
    for prompt, ours, sequence, theirs in zip(
        prompts, logits, tokens, reference_logits(folder, tokens), strict=True
    ):
        theirs = theirs[len(prompt) - 1 :]  # the rows after the prompt and each new token
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)
        assert sequence[len(prompt) :] == theirs[:-1].argmax(-1).tolist()


@pytest.fixture(scope="module", params=sorted(SPECS))
def checkpoint(request, tmp_path_factory) -> Path:
    return make_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_prefill_and_decode_logits_match_transformers(checkpoint, level):
    runner = ModelRunner(load_model(checkpoint, compilation_config=LEVELS[level]), num_blocks=64)
    for prompts in ([PROMPT], BATCH):
        logits, tokens = run_steps(runner, prompts, DECODE_STEPS)
        assert_matches_transformers(checkpoint, prompts, logits, tokens)


def test_a_sharded_checkpoint_gives_the_same_logits(tmp_path):
    folder = make_checkpoint("qwen3", tmp_path, max_shard_size="100KB")
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 2
    runner = ModelRunner(load_model(folder, compilation_config=LEVELS["level0"]), num_blocks=64)
    logits, tokens = run_steps(runner, BATCH, DECODE_STEPS)
    assert_matches_transformers(folder, BATCH, logits, tokens)


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_sharded_and_single_file_checkpoints_load_the_same_weights(spec, tmp_path):
    single = load_model(
        make_checkpoint(spec, tmp_path / "single"), compilation_config=LEVELS["level0"]
    )
    folder = make_checkpoint(spec, tmp_path / "sharded", max_shard_size="100KB")
    sharded = load_model(folder, compilation_config=LEVELS["level0"])
    expected = single.state_dict()
    assert sharded.state_dict().keys() == expected.keys()
    for name, tensor in sharded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


@pytest.mark.slow
def test_inductor_logits_match_transformers(tmp_path):
    folder = make_checkpoint("llama-tied-llama3", tmp_path / "ckpt")
    config = CompilationConfig(level=3, backend="inductor", cache_dir=str(tmp_path / "cache"))
    runner = ModelRunner(load_model(folder, compilation_config=config), num_blocks=64)
    logits, tokens = run_steps(runner, BATCH, DECODE_STEPS)
    assert_matches_transformers(folder, BATCH, logits, tokens)
