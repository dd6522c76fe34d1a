"""FULL graphs through the ModelRunner on the CPU graph API: attention inside the graph.

The recorded graph API replays the ops its capture recorded, with the metadata tensors and
host counts the capture saw, as a device graph does; so a FULL step gives the right
tokens only if the runner refills the static metadata in place.
"""

from __future__ import annotations

import pytest
from runner_cases import (  # noqa: F401 - the fixture is used by name
    PROMPTS,
    SIZES,
    TINY_HEAD_32,
    _lazy_captures_after_each_test,
)

from slotwise.compilation import CompilationConfig, ConfigError, counters
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_cpu.attention import CpuSdpaBackend
from slotwise_cuda.attention import TritonPagedBackend
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids


def runners(preset, graph_mode: str) -> tuple[ModelRunner, ModelRunner]:
    """A runner with graphs and its eager twin (same weights, same backend)."""
    config = CompilationConfig(level=3, backend="eager", capture_sizes=SIZES, graph_mode=graph_mode)
    graphs = ModelRunner(build_llama(preset, seed=0, compilation_config=config), num_blocks=32)
    eager = build_llama(preset, seed=0, compilation_config=CompilationConfig(level=0))
    return graphs, ModelRunner(eager, num_blocks=32)


@pytest.mark.parametrize(
    "backend, graph_mode, fix",
    [
        (CpuSdpaBackend, "FULL_AND_PIECEWISE", "PIECEWISE_ONLY; use graph_mode=PIECEWISE"),
        (CpuSdpaBackend, "FULL", "PIECEWISE_ONLY; use graph_mode=PIECEWISE"),
        (AscendStubReferenceBackend, "FULL", "UNIFORM_DECODE; use graph_mode=FULL_AND_PIECEWISE"),
    ],
)
def test_full_graphs_need_a_backend_that_can_be_captured(
    graph_platform_with, backend, graph_mode, fix
):
    graph_platform_with(backend)
    config = CompilationConfig(level=3, backend="eager", graph_mode=graph_mode)
    model = build_llama("tiny", seed=0, compilation_config=config)
    with pytest.raises(ConfigError, match=f"'graph_mode': {graph_mode} .*{fix}"):
        ModelRunner(model, num_blocks=8)


def test_full_and_piecewise_replays_one_graph_per_decode_step(graph_platform_with):
    api = graph_platform_with(AscendStubReferenceBackend)
    runner, eager = runners("tiny", "FULL_AND_PIECEWISE")
    pieces = PRESETS["tiny"].num_layers + 1
    with counters.expect(num_graphs_captured=len(SIZES) * (1 + pieces)):
        runner.capture(progress=False)

    requests = runner.add_requests(PROMPTS, 3)
    replays = api.replays
    logits = runner.step(requests)  # a prefill: the pieces' graphs, attention between them
    assert api.replays - replays == pieces
    for _ in range(2):
        for request, token in zip(requests, logits.argmax(-1).tolist(), strict=True):
            request.tokens.append(token)
        replays = api.replays
        logits = runner.step(requests)  # a uniform decode: the whole model's graph
        assert api.replays - replays == 1
    runner.free(requests)

    with counters.expect(num_graphs_captured=0):
        assert generate_token_ids(runner, PROMPTS, 6) == generate_token_ids(eager, PROMPTS, 6)


def test_static_block_tables_are_as_wide_as_the_longest_request(graph_platform_with):
    graph_platform_with(AscendStubReferenceBackend)
    config = CompilationConfig(
        level=3, backend="eager", capture_sizes=SIZES, graph_mode="FULL_AND_PIECEWISE"
    )
    model = build_llama("tiny", seed=0, compilation_config=config)
    runner = ModelRunner(model, num_blocks=32, max_model_len=40)
    assert runner.static_metadata.block_table.shape == (max(SIZES), 3)  # 40 tokens, blocks of 16


def test_the_scratch_block_is_reserved_for_the_runners_lifetime(graph_platform_with):
    graph_platform_with(AscendStubReferenceBackend)
    runner, _ = runners("tiny", "FULL_AND_PIECEWISE")
    scratch = runner.static_metadata.scratch_block
    assert runner.allocator.num_free_blocks == 31
    requests = runner.add_requests([[1] * 16] * 3, 80)  # every other block
    assert scratch not in {block for request in requests for block in request.block_ids}


def test_full_graphs_capture_mixed_batches_with_the_triton_backend(
    graph_platform_with, interpreted_triton
):
    api = graph_platform_with(TritonPagedBackend)
    runner, eager = runners(TINY_HEAD_32, "FULL")
    with counters.expect(num_graphs_captured=len(SIZES)):  # the whole model, once per size
        runner.capture(progress=False)
    requests = runner.add_requests(PROMPTS, 1)
    replays = api.replays
    runner.step(requests)  # a prefill padded to 8, replayed as one graph
    assert api.replays - replays == 1
    runner.free(requests)
    with counters.expect(num_graphs_captured=0):
        assert generate_token_ids(runner, PROMPTS, 4) == generate_token_ids(eager, PROMPTS, 4)
