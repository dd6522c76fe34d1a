"""The model runner's static graphs on real CUDA graphs (skipped without a GPU): its
greedy tokens in every graph mode are eager's."""

from __future__ import annotations

import pytest

from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise.platforms import use_platform
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda_platform():
    from slotwise_cuda.platform import CudaPlatform

    with use_platform(CudaPlatform()) as platform:
        yield platform


@pytest.mark.parametrize("graph_mode", ["PIECEWISE", "FULL_AND_PIECEWISE", "FULL"])
def test_runner_generates_the_eager_tokens_with_cuda_graphs(cuda_platform, graph_mode):
    prompts = [[1, 5, 9], [7, 7], [42, 11]]  # the prefill pads to 8, decodes to 4
    config = CompilationConfig(
        level=3, backend="eager", capture_sizes=[1, 2, 4, 8], graph_mode=graph_mode
    )
    try:
        model = build_llama("small", seed=0, device="cuda", compilation_config=config)
        runner = ModelRunner(model, num_blocks=64)
        runner.capture(progress=False)
        eager = build_llama("small", seed=0, device="cuda", compilation_config={"level": 0})
        with counters.expect(num_graphs_captured=0):
            tokens = generate_token_ids(runner, prompts, 8)
        assert tokens == generate_token_ids(ModelRunner(eager, num_blocks=64), prompts, 8)
    finally:
        reset_capture_window()
