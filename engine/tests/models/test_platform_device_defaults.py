"""What places tensors without being told where puts them on the current platform's device:
the model of ``build_llama`` and ``LlamaForCausalLM.empty``, the KV caches and the attention
metadata, so the README's quick start runs on any platform, not only where that device is
the CPU. Checked on a platform whose device type is neither cpu nor cuda: the ascend stub
on the meta device (placement and shapes only, no data)."""

from __future__ import annotations

import pytest

from slotwise.attention import AttentionMetadataBuilder
from slotwise.platforms import use_platform
from slotwise_ascend_stub.platform import AscendStubPlatform
from slotwise_engine.models.llama import PRESETS, LlamaForCausalLM, build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids


class MetaDeviceStub(AscendStubPlatform):
    """The ascend stub (its attention backend, its graphs) with tensors on "meta"."""

    device_type = "meta"


def devices(module) -> set[str]:
    return {str(t.device) for t in (*module.parameters(), *module.buffers())}


def test_build_llama_and_the_runner_put_everything_on_the_platforms_device():
    with use_platform(MetaDeviceStub()):
        model = build_llama("tiny", compilation_config={"level": 0})
        runner = ModelRunner(model, num_blocks=8)
        metadata = runner.metadata_builder.build([1, 3], [4, 0], [[0], [1]])
    assert devices(model) == {"meta"}
    assert runner.device.type == "meta"
    assert {str(layer.self_attn.attn.kv_cache.device) for layer in model.model.layers} == {"meta"}
    assert {metadata.slot_mapping.device.type, metadata.block_table.device.type} == {"meta"}


def test_an_empty_model_is_on_the_platforms_device_unless_told_otherwise():
    with use_platform(MetaDeviceStub()):
        default = LlamaForCausalLM.empty(PRESETS["tiny"], compilation_config={"level": 0})
        on_cpu = LlamaForCausalLM.empty(
            PRESETS["tiny"], device="cpu", compilation_config={"level": 0}
        )
    assert devices(default) == {"meta"}
    assert devices(on_cpu) == {"cpu"}


def test_attention_metadata_is_built_on_the_platforms_device_unless_told_otherwise():
    with use_platform(MetaDeviceStub()):
        default = AttentionMetadataBuilder(16).build([1], [19], [[0, 1]])
        on_cpu = AttentionMetadataBuilder(16, "cpu").build([1], [19], [[0, 1]])
    tensors = ("query_start_loc", "seq_lens", "slot_mapping", "block_table")
    assert {getattr(default, name).device.type for name in tensors} == {"meta"}
    assert {getattr(on_cpu, name).device.type for name in tensors} == {"cpu"}
    assert on_cpu.slot_mapping.tolist() == [1 * 16 + 3]


@pytest.mark.cuda
def test_the_readme_quick_start_runs_on_a_gpu():
    model = build_llama("tiny", seed=0, compilation_config={"level": 3})
    runner = ModelRunner(model, num_blocks=64)
    runner.capture()
    tokens = generate_token_ids(runner, [[1, 5, 9, 3]], max_new_tokens=8)
    assert runner.device.type == "cuda" and {d.split(":")[0] for d in devices(model)} == {"cuda"}
    assert len(tokens[0]) == 8
