"""config.json as transformers reads it: both RoPE forms, HF defaults, sliding windows,
RoPE scaling against transformers' own frequencies, and a lazy package import."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slotwise.layers.rotary_embedding import RopeScaling, RotaryEmbedding
from slotwise_engine.models import CheckpointError, supported_architectures
from slotwise_engine.models.hf_config import HFConfig
from slotwise_engine.models.llama import LlamaForCausalLM
from slotwise_engine.models.mistral import MistralForCausalLM
from slotwise_engine.models.qwen2 import Qwen2ForCausalLM
from slotwise_engine.models.qwen3 import Qwen3ForCausalLM
from slotwise_engine.models.registry import model_class

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
    assert Qwen2ForCausalLM.config_from_hf(hf(num_key_value_heads=2)).qkv_bias
    assert not Qwen2ForCausalLM.config_from_hf(hf(num_key_value_heads=2)).o_proj_bias
    qwen3 = Qwen3ForCausalLM.config_from_hf(hf(head_dim=32, num_key_value_heads=2))
    assert qwen3.qk_norm and qwen3.head_size == 32 and not qwen3.qkv_bias
    biased = hf(attention_bias=True, mlp_bias=True, num_key_value_heads=2)
    mistral = MistralForCausalLM.config_from_hf(biased)  # its model has no bias at all
    assert not (mistral.qkv_bias or mistral.o_proj_bias or mistral.mlp_bias)


@pytest.mark.parametrize(
    "cls, head_size, num_kv_heads",
    [
        (LlamaForCausalLM, 8, 32),
        (MistralForCausalLM, 8, 8),
        (Qwen2ForCausalLM, 8, 32),
        (Qwen3ForCausalLM, 128, 32),
    ],
)
def test_each_family_fills_absent_keys_with_its_transformers_defaults(cls, head_size, num_kv_heads):
    transformers = pytest.importorskip("transformers")
    fields = {**BASE, "hidden_size": 256, "num_attention_heads": 32}
    config = cls.config_from_hf(HFConfig(fields, Path("ckpt/config.json")))
    assert (config.head_size, config.num_kv_heads) == (head_size, num_kv_heads)
    name = cls.__name__.replace("ForCausalLM", "Config")
    reference = getattr(transformers, name)(
        **{k: v for k, v in fields.items() if k != "architectures"}
    )
    # Qwen2Config has no head_dim: its model divides hidden_size by the heads
    derived = fields["hidden_size"] // fields["num_attention_heads"]
    assert getattr(reference, "head_dim", derived) == head_size
    assert reference.num_key_value_heads == num_kv_heads


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
    "cls, fields, max_position",
    [
        (MistralForCausalLM, {"sliding_window": 1024}, 1024),  # every layer slides
        (MistralForCausalLM, {"sliding_window": 8192}, 4096),  # longer than the model
        (MistralForCausalLM, {}, 4096),  # absent: transformers' 4096
        (MistralForCausalLM, {"max_position_embeddings": 8192}, 4096),
        (MistralForCausalLM, {"sliding_window": None, "max_position_embeddings": 8192}, 8192),
        # Mistral's model ignores use_sliding_window and max_window_layers
        (MistralForCausalLM, {"sliding_window": 1024, "use_sliding_window": False}, 1024),
        (MistralForCausalLM, {"sliding_window": 1024, "max_window_layers": 2}, 1024),
        # with layer_types, transformers reads a Mistral config as Ministral's
        (MistralForCausalLM, {"head_dim": 16, "layer_types": ["full_attention"] * 2}, 4096),
        (
            MistralForCausalLM,
            {"head_dim": 16, "sliding_window": 1024, "layer_types": ["full_attention"] * 2},
            4096,
        ),
        (MistralForCausalLM, {"head_dim": 16, "layer_types": ["sliding_attention"] * 2}, 4096),
        (
            MistralForCausalLM,
            {
                "head_dim": 16,
                "max_position_embeddings": 8192,
                "layer_types": ["sliding_attention"] * 2,
            },
            4096,
        ),
        (Qwen2ForCausalLM, {"sliding_window": 1024}, 4096),  # use_sliding_window: false
        (Qwen2ForCausalLM, {"sliding_window": 1024, "use_sliding_window": False}, 4096),
        # max_window_layers defaults to 28: both layers full
        (Qwen2ForCausalLM, {"sliding_window": 1024, "use_sliding_window": True}, 4096),
        (
            Qwen2ForCausalLM,
            {"sliding_window": 1024, "use_sliding_window": True, "max_window_layers": 2},
            4096,
        ),
        (
            Qwen2ForCausalLM,
            {"sliding_window": 1024, "use_sliding_window": True, "max_window_layers": 1},
            1024,
        ),
        (
            Qwen2ForCausalLM,
            {"use_sliding_window": True, "max_window_layers": 1, "max_position_embeddings": 8192},
            4096,
        ),
        (
            Qwen2ForCausalLM,
            {
                "sliding_window": 1024,
                "use_sliding_window": True,
                "layer_types": ["full_attention"] * 2,
                "max_window_layers": 0,
            },
            4096,
        ),
        (
            Qwen2ForCausalLM,
            {
                "sliding_window": 1024,
                "use_sliding_window": True,
                "layer_types": ["full_attention", "sliding_attention"],
            },
            1024,
        ),
        (
            Qwen3ForCausalLM,
            {"sliding_window": 1024, "use_sliding_window": True, "max_window_layers": 0},
            1024,
        ),
        # Llama's model has no window, but transformers' KV cache keeps only the window
        # of the layers layer_types marks sliding (all where absent) when decoding
        (LlamaForCausalLM, {"sliding_window": 1024}, 1024),
        (LlamaForCausalLM, {"sliding_window": 1024, "use_sliding_window": False}, 1024),
        (LlamaForCausalLM, {"sliding_window": 1024, "layer_types": ["full_attention"] * 2}, 4096),
        (LlamaForCausalLM, {"use_sliding_window": True, "max_window_layers": 0}, 4096),
    ],
)
def test_a_sliding_window_caps_the_request_length(cls, fields, max_position, caplog):
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        config = cls.config_from_hf(hf(num_key_value_heads=2, **fields))
    assert config.max_position == max_position
    declared = fields.get("max_position_embeddings", BASE["max_position_embeddings"])
    assert ("sliding window of" in caplog.text) == (max_position < declared)


@pytest.mark.parametrize(
    "cls, fields, cause",
    [
        (
            Qwen2ForCausalLM,
            {"sliding_window": 1024, "layer_types": ["sliding_attention", "full_attention"]},
            "but use_sliding_window is not true, so transformers has no window for them (and "
            "fails); set use_sliding_window to true, or list only full_attention layers",
        ),
        (
            Qwen3ForCausalLM,
            {
                "use_sliding_window": True,
                "sliding_window": None,
                "layer_types": ["sliding_attention"] * 2,
            },
            "but sliding_window is not set, so transformers has no window for them (and fails); "
            "set sliding_window, or list only full_attention layers",
        ),
        (
            LlamaForCausalLM,
            {"layer_types": ["full_attention", "sliding_attention"]},
            "but sliding_window is not set",
        ),
        (
            MistralForCausalLM,
            {"head_dim": 16, "sliding_window": None, "layer_types": ["sliding_attention"] * 2},
            "but sliding_window is not set",
        ),
    ],
)
def test_sliding_layers_without_a_window_are_refused(cls, fields, cause):
    with pytest.raises(CheckpointError) as info:
        cls.config_from_hf(hf(num_key_value_heads=2, **fields))
    message = str(info.value)
    assert message.startswith("ckpt/config.json: layer_types lists sliding_attention layers")
    assert cause in message


def test_a_mistral_config_with_layer_types_needs_head_dim():
    """transformers reads it as Ministral's, whose model fails without head_dim."""
    with pytest.raises(CheckpointError, match="set head_dim, or remove layer_types"):
        MistralForCausalLM.config_from_hf(hf(layer_types=["full_attention"] * 2))


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


LLAMA3_16 = {
    "rope_type": "llama3",
    "rope_theta": 5e4,
    **LLAMA3,
    "original_max_position_embeddings": 16,
}
YARN_16 = {
    "rope_type": "yarn",
    "rope_theta": 3e3,
    "factor": 2.0,
    "original_max_position_embeddings": 16,
}


@pytest.mark.parametrize(
    "fields",
    [
        # a non-empty rope_scaling replaces rope_parameters whole, rope_theta included
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_scaling": YARN_16},
        {"rope_parameters": LLAMA3_16, "rope_scaling": {"type": "linear", "factor": 4.0}},
        {
            "rope_parameters": LLAMA3_16,
            "rope_scaling": {"type": "linear", "factor": 4.0},
            "rope_theta": 1234.0,
        },
        {"rope_parameters": LLAMA3_16, "rope_scaling": {}},
        # rope_theta inside the RoPE object wins over the top-level one
        {
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 77.0},
            "rope_theta": 1e6,
        },
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 1e6},
        # rope_type wins over type
        {"rope_parameters": {"type": "linear", "rope_type": "default", "factor": 3.0}},
        # a top-level original_max_position_embeddings wins for llama3 and yarn
        {"rope_parameters": LLAMA3_16, "original_max_position_embeddings": 64},
        {"rope_scaling": YARN_16, "original_max_position_embeddings": 128},
        {
            "rope_parameters": {"rope_type": "linear", "factor": 2.0},
            "original_max_position_embeddings": 8,
        },
    ],
)
def test_overlapping_rope_keys_give_transformers_angles(fields, caplog):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    plain = {k: v for k, v in BASE.items() if k != "architectures"}
    reference = transformers.LlamaConfig.from_dict({**plain, **copy.deepcopy(fields)})
    cos, sin = LlamaRotaryEmbedding(reference)(torch.zeros(1), torch.arange(64)[None])
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        theta, scaling = hf(**fields).rope(BASE["max_position_embeddings"])
    table = RotaryEmbedding(16, 64, theta, scaling=scaling).cos_sin_cache
    torch.testing.assert_close(table, torch.cat([cos[0, :, :8], sin[0, :, :8]], dim=-1))
    both = fields.get("rope_scaling") and fields.get("rope_parameters")
    assert ("rope_scaling is used and rope_parameters ignored" in caplog.text) == bool(both)


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
        "import sys, slotwise, slotwise_engine.models\n"
        "assert issubclass(slotwise_engine.models.CheckpointError, ValueError)\n"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules\n"
        "    if m.split('.')[0] in ('torch', 'safetensors', 'tokenizers', 'transformers'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
