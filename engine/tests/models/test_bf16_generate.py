"""``slotwise generate --dtype bfloat16`` on the CPU, end to end: tokenizer, prefill,
decode steps through the CPU plugin's kernels at level 3, sampling, text.

transformers in float32 is the oracle, run on the tokens bfloat16 produced: at every
step the greedy token bfloat16 chose must be one float32 ranks (nearly) first.  With
bfloat16's logits within 0.3 standard deviations of float32's (the tolerance stated in
test_bf16_decode_parity.py), a chosen token's float32 logit can fall short of the
float32 maximum by at most twice that; sampling with a seed must repeat.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from hf_checkpoints import make_checkpoint, reference_logits
from hf_tokenizers import make_tokenizer

from slotwise.compilation.config import ENV_CONFIG

cli_main = importlib.import_module("slotwise.cli.main")

PROMPTS = ["Hello world, the quick fox", "Grüße aus Köln 日本語 🙂"]
N = 12
LEVEL3 = ["-O3", "-O.backend=eager"]
TOLERANCE = 0.3  # standard deviations of the float32 logits


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tokenizer(make_checkpoint("llama", tmp_path_factory.mktemp("llama")), "llama3")


@pytest.fixture
def generate(monkeypatch, capsys):
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)

    def run(*args: str) -> list[dict]:
        code = cli_main.main(["generate", *args])
        out, err = capsys.readouterr()
        assert code == 0, err
        return [json.loads(line) for line in out.splitlines()]

    return run


def test_each_bfloat16_greedy_token_is_one_float32_ranks_first(folder, generate):
    prompt_args = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    results = generate(
        "--model", str(folder), *prompt_args, "--max-new-tokens", str(N), "--ignore-eos",
        "--dtype", "bfloat16", "--json", *LEVEL3,
    )  # fmt: skip
    for result in results:
        prompt, tokens = result["prompt_token_ids"], result["token_ids"]
        assert len(tokens) == N and result["text"]
        (logits,) = reference_logits(folder, [prompt + tokens])
        steps = logits[len(prompt) - 1 : -1]  # the logits each chosen token came from
        chosen = steps.gather(1, steps.new_tensor(tokens).long()[:, None])[:, 0]
        shortfall = (steps.max(-1).values - chosen) / steps.std(-1)
        assert (shortfall <= 2 * TOLERANCE).all(), shortfall


def test_bfloat16_sampling_with_a_seed_repeats(folder, generate):
    args = ["--model", str(folder), "--prompt", PROMPTS[0], "--max-new-tokens", "8",
            "--ignore-eos", "--dtype", "bfloat16", "--temperature", "0.8", "--top-p", "0.9",
            "--seed", "7", "--json", *LEVEL3]  # fmt: skip
    first, second = generate(*args), generate(*args)
    assert first[0]["token_ids"] == second[0]["token_ids"] and len(first[0]["token_ids"]) == 8
