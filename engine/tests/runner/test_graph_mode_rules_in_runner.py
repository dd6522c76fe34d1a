"""vLLM's graph-mode rules, end to end through the ModelRunner on the CPU graph API.

The recorded graph API replays what its capture recorded, so a graph captured without what
it needs (attention without metadata) replays wrong numbers, and the tokens show it:
with nothing split there are no piecewise graphs, under TORCH_COMPILE_DISABLE=1 no graphs
at all, and either way the runner neither pads nor reports a capture, and its greedy
tokens are eager's.
"""

from __future__ import annotations

import logging

import pytest
import torch._dynamo.config
from runner_cases import (  # noqa: F401 - the fixture is used by name
    PROMPTS,
    SIZES,
    TINY_HEAD_32,
    _lazy_captures_after_each_test,
)

from slotwise.compilation import CompilationConfig, ConfigError, GraphMode, counters
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_cpu.attention import CpuSdpaBackend
from slotwise_cuda.attention import TritonPagedBackend
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids


def runner(preset, **fields) -> ModelRunner:
    config = CompilationConfig(level=3, backend="eager", capture_sizes=SIZES, **fields)
    return ModelRunner(build_llama(preset, seed=0, compilation_config=config), num_blocks=32)


def eager_tokens(preset, max_new_tokens: int) -> list[list[int]]:
    model = build_llama(preset, seed=0, compilation_config=CompilationConfig(level=0))
    return generate_token_ids(ModelRunner(model, num_blocks=32), PROMPTS, max_new_tokens)


@pytest.mark.parametrize(
    "backend, requested",
    [
        (CpuSdpaBackend, GraphMode.PIECEWISE),  # PIECEWISE_ONLY
        # UNIFORM_DECODE allows no full graph of every batch, so FULL is no way out.
        (AscendStubReferenceBackend, GraphMode.FULL_AND_PIECEWISE),
        (CpuSdpaBackend, GraphMode.FULL_AND_PIECEWISE),
    ],
)
def test_nothing_split_captures_no_pieces_and_gives_eagers_tokens(
    graph_platform_with, caplog, backend, requested
):
    api = graph_platform_with(backend)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        graphs = runner("tiny", graph_mode=requested, splitting_ops=[])
    assert graphs.config.graph_mode == GraphMode.NONE
    (warning,) = [r for r in caplog.records if "graph_mode" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage().startswith(f"graph_mode={requested.name} turned to NONE: ")
    assert graphs.capture_sizes == [] and graphs.padded_size(3) == 3  # no padding
    with counters.expect(num_graphs_captured=0):
        assert graphs.capture(progress=False) == []
        assert generate_token_ids(graphs, PROMPTS, 5) == eager_tokens("tiny", 5)
    assert api.replays == 0


@pytest.mark.slow
def test_nothing_split_turns_full_and_piecewise_into_full_graphs_of_the_whole_model(
    graph_platform_with, interpreted_triton, caplog
):
    api = graph_platform_with(TritonPagedBackend)  # graph_support ALWAYS
    with caplog.at_level(logging.INFO, logger="slotwise"):
        graphs = runner(TINY_HEAD_32, graph_mode="FULL_AND_PIECEWISE", splitting_ops=[])
    assert graphs.config.graph_mode == GraphMode.FULL
    (warning,) = [r for r in caplog.records if "graph_mode" in r.getMessage()]
    assert warning.getMessage().startswith("graph_mode=FULL_AND_PIECEWISE turned to FULL: ")
    with counters.expect(num_graphs_captured=len(SIZES)):  # the whole model, once per size
        reports = graphs.capture(progress=False)
    assert sorted((r.size, r.graphs) for r in reports) == [(size, 1) for size in SIZES]
    requests = graphs.add_requests(PROMPTS, 1)
    replays = api.replays
    graphs.step(requests)  # a prefill padded to 8, attention inside the one graph
    assert api.replays - replays == 1
    graphs.free(requests)
    with counters.expect(num_graphs_captured=0):
        assert generate_token_ids(graphs, PROMPTS, 4) == eager_tokens(TINY_HEAD_32, 4)


def test_torch_compile_disable_runs_eagerly_without_padding_or_captures(graph_platform_with):
    api = graph_platform_with(AscendStubReferenceBackend)
    with torch._dynamo.config.patch(disable=True):
        graphs = runner("tiny")  # FULL_AND_PIECEWISE by default, were it compiled
        assert graphs.config.graph_mode == GraphMode.NONE
        assert graphs.capture_sizes == [] and graphs.static_metadata is None
        with counters.expect(num_graphs_captured=0, num_graphs_seen=0, num_models_seen=0):
            assert graphs.capture(progress=False) == []
            assert generate_token_ids(graphs, PROMPTS, 5) == eager_tokens("tiny", 5)
    assert api.replays == 0


@pytest.mark.parametrize("level", [0, 1])
def test_a_graph_mode_below_level_two_is_refused_before_the_runner_could_pad(
    graph_platform_with, level
):
    graph_platform_with(AscendStubReferenceBackend)
    config = CompilationConfig(level=level, backend="eager", graph_mode="FULL")
    with pytest.raises(ConfigError, match=f"level is {level} .*; set level=3 or graph_mode=NONE"):
        build_llama("tiny", seed=0, compilation_config=config)


@pytest.mark.slow
def test_level_two_full_graphs_capture_the_whole_model(graph_platform_with, interpreted_triton):
    """FULL graphs need compilation, not a split: level 2's one traced graph has them."""
    graph_platform_with(TritonPagedBackend)
    config = CompilationConfig(level=2, backend="eager", capture_sizes=[4], graph_mode="FULL")
    graphs = ModelRunner(
        build_llama(TINY_HEAD_32, seed=0, compilation_config=config), num_blocks=32
    )
    with counters.expect(num_graphs_captured=1):
        (report,) = graphs.capture(progress=False)
    assert (report.size, report.graphs) == (4, 1)


def test_compile_sizes_the_runner_pads_past_are_named_in_one_warning(graph_platform_with, caplog):
    graph_platform_with(CpuSdpaBackend)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        runner("tiny", graph_mode="PIECEWISE", compile_sizes=[3, 4, 16])
    (warning,) = [r for r in caplog.records if "compile_sizes" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage().startswith(
        "compilation config key 'compile_sizes': [3] are never a step's size, since the runner "
        "pads every step of up to 8 tokens to a capture size ([1, 2, 4, 8])"
    )
