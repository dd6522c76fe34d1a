"""Small random Hugging Face checkpoints made by transformers, and its logits for them.

transformers is the oracle here and nothing else: slotwise never imports it.  Each
spec is a config small enough to build in milliseconds, with weights large enough
(initializer_range 0.3) that logits are far from uniform and greedy tokens are not
near ties.  ``make_checkpoint`` saves one with ``save_pretrained`` (one file, or
shards of ``max_shard_size``); ``reference_logits`` reloads that folder with
transformers and returns its logits for a token sequence.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slotwise_engine.runner.model_runner import ModelRunner

SMALL = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.3,
}

#: name -> (transformers config class name, fields over SMALL)
SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    # Tied embeddings and llama3 RoPE scaling whose original context (16) is far below
    # the positions the tests reach, so the scaled frequencies matter.
    "llama-tied-llama3": (
        "LlamaConfig",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    # Every bias, a head_dim unlike hidden_size / heads, linear RoPE scaling.
    "llama-bias-linear": (
        "LlamaConfig",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "head_dim": 32,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        },
    ),
    # Mistral's default sliding window (4096) is below its max_position_embeddings.
    "mistral": ("MistralConfig", {"max_position_embeddings": 8192}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
}


#: Length-extending RoPE types (tests/models/test_rope_scaling.py), apart from SPECS:
#: transformers' ``dynamic`` logits of a whole sequence recomputed at once differ from
#: those of its generation with a KV cache, which is what slotwise reproduces.
ROPE_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    # NTK-scaled RoPE: the base grows with the sequence once it passes 32 tokens.
    "llama-dynamic": (
        "LlamaConfig",
        {
            "max_position_embeddings": 32,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
        },
    ),
    # YaRN over an original context of 32 tokens, stretched to 128.
    "llama-yarn": (
        "LlamaConfig",
        {
            "max_position_embeddings": 128,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
}


def make_checkpoint(
    name: str,
    folder: Path,
    *,
    max_shard_size: str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Path:
    """Save a random model of spec ``name`` into ``folder``; returns ``folder``."""
    import transformers

    config_class, fields = {**SPECS, **ROPE_SPECS}[name]
    config = getattr(transformers, config_class)(**{**SMALL, **fields})
    config.architectures = [config_class.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    options = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **options)
    return folder


def edit_config(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite ``folder``'s config.json through ``edit`` (which changes the dict in place)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))


def reference_logits(folder: Path, sequences: list[list[int]]) -> list[torch.Tensor]:
    """transformers' float32 logits [len(tokens), vocab] of each token sequence, each
    run on its own from position 0."""
    model = _transformers_model(folder)
    with torch.no_grad():
        return [model(torch.tensor([tokens])).logits[0].float() for tokens in sequences]


@functools.lru_cache(maxsize=4)
def _transformers_model(folder: Path) -> torch.nn.Module:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def reference_greedy(folder: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (with its KV cache, as
    ``generate`` runs; shorter where it ends in an end-of-sequence token), from a
    freshly loaded model: transformers' dynamic RoPE keeps state between calls."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def run_steps(
    runner: ModelRunner, prompts: list[list[int]], decode_steps: int
) -> tuple[torch.Tensor, list[list[int]]]:
    """Logits [len(prompts), 1 + decode_steps, vocab] of the prefill and each greedy
    decode step, and each prompt's tokens with its continuation."""
    sequences = runner.add_requests(prompts, decode_steps)
    try:
        steps = [runner.step(sequences)]
        for _ in range(decode_steps):
            for sequence, token in zip(sequences, steps[-1].argmax(-1).tolist(), strict=True):
                sequence.tokens.append(token)
            steps.append(runner.step(sequences))
        return torch.stack(steps, dim=1), [s.tokens for s in sequences]
    finally:
        runner.free(sequences)
