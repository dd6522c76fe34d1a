"""The default graph mode, end to end through the ModelRunner on the CPU graph API.

A config that names no graph mode gets FULL_AND_PIECEWISE when the attention backend
may be captured in full graphs of uniform decodes, PIECEWISE when it may not; either
way every step's logits are eager's, for decode steps (one graph of the whole model
under FULL_AND_PIECEWISE) and for mixed prefill/decode batches (the pieces).
"""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, GraphMode
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_cpu.attention import CpuSdpaBackend
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner

SIZES = [1, 2, 4, 8]
PIECES = PRESETS["tiny"].num_layers + 1


@pytest.fixture(autouse=True)
def _lazy_captures_after_each_test():
    yield
    reset_capture_window()


def default_and_eager() -> tuple[ModelRunner, ModelRunner]:
    """A runner whose config leaves the graph mode to the default, and its eager twin."""
    config = CompilationConfig(level=3, backend="eager", capture_sizes=SIZES)
    graphs = ModelRunner(build_llama("tiny", seed=0, compilation_config=config), num_blocks=32)
    eager = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    return graphs, ModelRunner(eager, num_blocks=32)


def step_both(runners, requests, api) -> int:
    """One step on each runner; the logits must agree. Returns the graph replays."""
    replays = api.replays
    logits = [runner.step(batch) for runner, batch in zip(runners, requests, strict=True)]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    tokens = logits[1].argmax(-1).tolist()
    for batch in requests:
        for request, token in zip(batch, tokens, strict=True):
            request.tokens.append(token)
    return api.replays - replays


@pytest.mark.parametrize(
    "backend, mode, decode_replays",
    [
        (AscendStubReferenceBackend, GraphMode.FULL_AND_PIECEWISE, 1),  # the whole model
        (CpuSdpaBackend, GraphMode.PIECEWISE, PIECES),
    ],
)
def test_default_mode_steps_equal_eager_for_decodes_and_mixed_batches(
    graph_platform_with, backend, mode, decode_replays
):
    api = graph_platform_with(backend)
    runner, eager = default_and_eager()
    assert runner.config.graph_mode == mode
    runner.capture(progress=False)
    runners = (runner, eager)

    first = [r.add_requests([[1, 5, 9], [7, 7]], 8) for r in runners]
    assert step_both(runners, first, api) == PIECES  # a prefill of 5 tokens, padded to 8
    for _ in range(2):  # uniform decodes of 2
        assert step_both(runners, first, api) == decode_replays
    # Two decodes and a 3-token prefill in one step: a mixed batch of 5, padded to 8,
    # which never runs in a full graph.
    late = [r.add_requests([[42, 11, 3]], 6) for r in runners]
    mixed = [[*old, *new] for old, new in zip(first, late, strict=True)]
    assert step_both(runners, mixed, api) == PIECES
    assert step_both(runners, mixed, api) == decode_replays  # a uniform decode of 3, in 4
