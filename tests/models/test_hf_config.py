"""config.json as transformers reads it: both RoPE forms, HF defaults, sliding windows,
RoPE scaling against transformers' own frequencies, and a lazy package import."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slotwise.layers.rotary_embedding import RopeScaling
from slotwise.models import supported_architectures
from slotwise.models.hf_config import HFConfig
from slotwise.models.llama import LlamaForCausalLM
from slotwise.models.mistral import MistralForCausalLM
from slotwise.models.qwen2 import Qwen2ForCausalLM
from slotwise.models.qwen3 import Qwen3ForCausalLM
from slotwise.models.registry import model_class

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 4096,
}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def hf(**fields) -> HFConfig:
    return HFConfig({**BASE, **fields}, Path("ckpt/config.json"))


def test_transformers_5_and_older_rope_forms_give_the_same_config():
    new = hf(
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3},
        dtype="bfloat16",
    )
    old = hf(rope_theta=5e5, rope_scaling={"type": "llama3", **LLAMA3}, torch_dtype="bfloat16")
    assert LlamaForCausalLM.config_from_hf(new) == LlamaForCausalLM.config_from_hf(old)
    config = LlamaForCausalLM.config_from_hf(new)
    assert config.rope_theta == 5e5
    # original_max_position_embeddings defaults to max_position_embeddings, as in transformers
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 4096)
    assert new.dtype() == old.dtype() == torch.bfloat16


def test_transformers_defaults_fill_what_config_json_leaves_out():
    config = LlamaForCausalLM.config_from_hf(hf())
    assert config.rms_norm_eps == 1e-6
    assert config.num_kv_heads == 4 and config.head_size == 16
    assert config.rope_theta == 10000.0 and config.rope_scaling is None
    assert not (config.tie_word_embeddings or config.qkv_bias or config.mlp_bias)
    assert config.bos_token_id is None and config.eos_token_ids == ()


def test_token_ids_and_explicit_fields():
    config = LlamaForCausalLM.config_from_hf(
        hf(head_dim=32, bos_token_id=1, eos_token_id=[7, 8], rms_norm_eps=1e-5, attention_bias=True)
    )
    assert config.head_size == 32 and config.rms_norm_eps == 1e-5
    assert config.bos_token_id == 1 and config.eos_token_ids == (7, 8)
    assert config.qkv_bias and config.o_proj_bias and not config.mlp_bias


def test_each_architecture_sets_its_own_features():
    assert Qwen2ForCausalLM.config_from_hf(hf()).qkv_bias
    assert not Qwen2ForCausalLM.config_from_hf(hf()).o_proj_bias
    qwen3 = Qwen3ForCausalLM.config_from_hf(hf(head_dim=32))
    assert qwen3.qk_norm and qwen3.head_size == 32 and not qwen3.qkv_bias


def test_the_registry_picks_the_first_supported_architecture():
    assert supported_architectures() == [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    ]
    assert model_class(hf(architectures=["Unknown", "MistralForCausalLM"])) is MistralForCausalLM
    assert model_class(hf(architectures=["Qwen3ForCausalLM"])) is Qwen3ForCausalLM


@pytest.mark.parametrize(
    "fields, max_position",
    [
        ({"sliding_window": 1024}, 1024),  # Mistral: every layer slides
        ({"sliding_window": 8192}, 4096),  # a window longer than the model changes nothing
        ({"sliding_window": 1024, "use_sliding_window": False}, 4096),  # Qwen: off
        ({"sliding_window": 1024, "use_sliding_window": True, "max_window_layers": 2}, 4096),
        ({"sliding_window": 1024, "use_sliding_window": True, "max_window_layers": 1}, 1024),
        ({"sliding_window": 1024, "layer_types": ["full_attention"] * 2}, 4096),
        ({"sliding_window": 1024, "layer_types": ["full_attention", "sliding_attention"]}, 1024),
    ],
)
def test_a_sliding_window_caps_the_request_length(fields, max_position, caplog):
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        config = MistralForCausalLM.config_from_hf(hf(**fields))
    assert config.max_position == max_position
    assert ("sliding window of 1024 tokens" in caplog.text) == (max_position == 1024)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            **LLAMA3,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 4.0,
            "original_max_position_embeddings": 512,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 8.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "truncate": False,
        },
        {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
    ],
    ids=["llama3", "linear", "yarn", "yarn-options", "dynamic"],
)
def test_rope_scaling_gives_transformers_frequencies(rope_parameters):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fields = {k: v for k, v in BASE.items() if k != "architectures"}
    reference = transformers.LlamaConfig(**fields, rope_parameters=dict(rope_parameters))
    expected, attention_factor = ROPE_INIT_FUNCTIONS[rope_parameters["rope_type"]](reference, "cpu")
    _, scaling = hf(rope_parameters=rope_parameters).rope(4096)
    assert scaling is not None
    torch.testing.assert_close(
        scaling.inv_freq(rope_parameters["rope_theta"], 16), expected, rtol=1e-6, atol=0
    )
    assert scaling.attention_factor == pytest.approx(attention_factor, rel=1e-12)


@pytest.mark.parametrize(
    "rope_parameters, context",
    [
        ({"rope_type": "linear", "factor": 4.0}, 4 * 4096),
        ({"rope_type": "dynamic", "factor": 2.0}, 2 * 4096),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 8192),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024}, 4096),
        ({"rope_type": "llama3", **LLAMA3, "original_max_position_embeddings": 1024}, 4096),
    ],
)
def test_scaled_rope_serves_the_stretched_context(rope_parameters, context):
    assert LlamaForCausalLM.config_from_hf(hf(rope_parameters=rope_parameters)).max_position == (
        context
    )


def test_importing_slotwise_models_imports_neither_torch_nor_safetensors():
    code = (
        "import sys, slotwise, slotwise.models\n"
        "assert issubclass(slotwise.models.CheckpointError, ValueError)\n"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules\n"
        "    if m.split('.')[0] in ('torch', 'safetensors', 'tokenizers', 'transformers'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
