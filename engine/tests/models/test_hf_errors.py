"""A bad checkpoint gives one CheckpointError naming the file, the tensor and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hf_checkpoints import edit_config, make_checkpoint
from safetensors.torch import load_file, save_file

from slotwise.distributed import state as distributed_state
from slotwise.errors import SlotwiseError
from slotwise_engine.models import CheckpointError, load_model, loader

LEVEL0 = {"level": 0}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def pristine_sharded(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("sharded"), max_shard_size="100KB")


@pytest.fixture
def folder(pristine, tmp_path) -> Path:
    """A copy of a good single-file checkpoint, for a test to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "checkpoint"))


def rewrite_weights(folder: Path, change) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def load_error(folder: Path, **options) -> str:
    with pytest.raises(CheckpointError) as info:
        load_model(folder, compilation_config=LEVEL0, **options)
    assert isinstance(info.value, SlotwiseError) and isinstance(info.value, ValueError)
    return str(info.value)


def test_the_good_checkpoint_loads(folder):
    model = load_model(folder, compilation_config=LEVEL0)
    assert model.config.vocab_size == 300 and model.config.eos_token_ids == (2,)


def test_missing_config(folder):
    (folder / "config.json").unlink()
    message = load_error(folder)
    assert f"{folder / 'config.json'}: missing" in message and "save_pretrained" in message


def test_unknown_architecture_lists_the_supported_ones(folder):
    edit_config(folder, lambda c: c.update(architectures=["GPT2LMHeadModel"]))
    message = load_error(folder)
    assert "config.json: architecture GPT2LMHeadModel is not supported" in message
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert name in message


def test_missing_tensor(folder):
    rewrite_weights(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    message = load_error(folder)
    assert "missing tensor(s) model.layers.1.mlp.up_proj.weight" in message
    assert "check that config.json belongs to these weights" in message


def test_unexpected_tensor(folder):
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(3)}))
    message = load_error(folder)
    assert "unexpected tensor(s) model.layers.0.extra.weight (in model.safetensors)" in message


def test_wrong_shape_names_expected_and_found(folder):
    name = "model.layers.0.self_attn.k_proj.weight"
    rewrite_weights(folder, lambda t: t.update({name: torch.zeros(16, 64)}))
    message = load_error(folder)
    assert f"model.safetensors: tensor {name} has shape [16, 64], expected [32, 64]" in message


def test_a_config_that_does_not_fit_the_weights(folder):
    edit_config(folder, lambda c: c.update(attention_bias=True))
    assert "missing tensor(s) model.layers.0.self_attn.q_proj.bias" in load_error(folder)


def test_truncated_file(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    message = load_error(folder)
    assert f"{path}: not a readable safetensors file" in message and "truncated" in message


def test_corrupt_header(folder):
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32
    path.write_bytes(bytes(data))
    assert f"{path}: not a readable safetensors file" in load_error(folder)


def test_index_naming_a_missing_shard(pristine_sharded, tmp_path):
    folder = Path(shutil.copytree(pristine_sharded, tmp_path / "sharded"))
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    message = load_error(folder)
    assert f"model.safetensors.index.json: names shard {shard.name}" in message
    assert "download the missing shard" in message


def test_no_safetensors_files(folder):
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    message = load_error(folder)
    assert "neither model.safetensors nor model.safetensors.index.json" in message
    assert "found pytorch_model.bin" in message


def test_a_tensor_parallel_size_that_does_not_divide_the_heads(folder, monkeypatch):
    monkeypatch.setattr(distributed_state, "get_tensor_parallel_world_size", lambda: 3)
    # No process group here: the ranks' agreement (its own tests) is not what is tested.
    monkeypatch.setattr(loader, "check_checkpoint_agreement", lambda folder: None)
    message = load_error(folder)
    assert (
        "num_attention_heads (4), num_key_value_heads (2), intermediate_size (128) cannot be split"
        in message
    )
    assert "tensor-parallel size 3" in message


def test_a_dtype_the_platform_does_not_support(folder):
    message = load_error(folder, dtype=torch.float64)
    assert "cannot run this model's attention in torch.float64" in message
    assert "pass load_model(..., dtype=...)" in message
    assert "not a floating-point dtype" in load_error(folder, dtype=torch.int32)


@pytest.mark.parametrize(
    "rope, expected",
    [
        ({"rope_type": "longrope", "factor": 4.0}, "rope type 'longrope' is not supported"),
        ({"rope_type": "su", "factor": 2.0}, "rope type 'su' is not supported"),
        ({"rope_type": "llama3", "factor": 8.0}, "rope type 'llama3' needs the field"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor is 0.5"),
    ],
)
def test_unsupported_rope(folder, rope, expected):
    edit_config(folder, lambda c: c["rope_parameters"].update(rope))
    message = load_error(folder)
    assert f"config.json: {expected}" in message


def test_quantized_checkpoint(folder):
    edit_config(folder, lambda c: c.update(quantization_config={"quant_method": "gptq"}))
    assert "quantized checkpoints are not supported" in load_error(folder)


@pytest.mark.parametrize(
    "edit, expected",
    [
        # What an audit found loading and generating token 0, or ending in a traceback.
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 0}},
            "'rope_parameters.factor' is 0",
        ),
        ({"rms_norm_eps": float("nan")}, "field 'rms_norm_eps' is nan; expected a finite number"),
        ({"rms_norm_eps": -1e-6}, "field 'rms_norm_eps' is -1e-06"),
        ({"vocab_size": -1}, "field 'vocab_size' is -1; expected an integer from 1 to 16777216"),
        ({"num_attention_heads": 0}, "field 'num_attention_heads' is 0"),
        ({"num_key_value_heads": 0}, "field 'num_key_value_heads' is 0"),
        ({"num_key_value_heads": 3}, "field 'num_key_value_heads' is 3; expected a divisor of"),
        ({"intermediate_size": 0}, "field 'intermediate_size' is 0"),
        ({"rope_theta": "1e4", "rope_parameters": None}, "field 'rope_theta' is '1e4'"),
        ({"rope_parameters": [1, 2]}, "field 'rope_parameters' is [1, 2]; expected a JSON object"),
        ({"max_position_embeddings": 1e9}, "field 'max_position_embeddings' is 1000000000.0"),
        (
            {"max_position_embeddings": 2**62},
            "field 'max_position_embeddings' is 4611686018427387904",
        ),
        ({"max_position_embeddings": -1}, "field 'max_position_embeddings' is -1"),
        ({"max_position_embeddings": 10**12}, "field 'max_position_embeddings' is 1000000000000"),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": -5}, "'sliding_window' is -5"),
        (
            {"hidden_size": 62, "head_dim": None},
            "hidden_size (62) is not a multiple of num_attention_heads (4)",
        ),
        ({"head_dim": 0}, "field 'head_dim' is 0"),
    ],
)
def test_a_config_value_out_of_range_names_the_field_and_what_is_allowed(folder, edit, expected):
    edit_config(folder, lambda c: c.update(edit))
    message = load_error(folder)
    assert f"{folder / 'config.json'}: " in message and expected in message
    assert "\n" not in message


def test_a_config_nested_200000_deep_is_refused_without_recursion(folder):
    (folder / "config.json").write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert "config.json: nests 200001 levels deep" in load_error(folder)


def test_a_weight_shape_that_disagrees_with_config_fails_before_any_allocation(folder):
    # 2^24 rows of 64 floats would be 4 GB; the headers refuse it first.
    edit_config(folder, lambda c: c.update(vocab_size=1 << 24))
    assert "model.embed_tokens.weight has shape [300, 64], expected [16777216, 64]" in (
        load_error(folder)
    )


def test_max_model_len_sizes_the_rotary_table(folder):
    model = load_model(folder, compilation_config=LEVEL0, max_model_len=40)
    assert model.config.max_position == 40
    assert model.model.rotary_emb.cos_sin_cache.shape[0] == 40
    assert "max_model_len 257 is not an integer from 1 to 256" in load_error(
        folder, max_model_len=257
    )
