"""The key static-graph cases of slotwise's core again, on this plugin's CUDA graphs
(skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.static_graphs.contract import StaticGraphError
from slotwise.compilation.static_graphs.dispatcher import GraphDispatcher
from slotwise.platforms import use_platform
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.fixture
def cuda_platform():
    from slotwise_cuda.platform import CudaPlatform

    with use_platform(CudaPlatform()) as platform:
        yield platform


def cuda_models(**changes):
    fields = {
        "level": 3,
        "backend": "inductor",
        "splitting_ops": TOY_SPLITTING_OPS,
        "capture_sizes": [1, 2],
        "graph_mode": "PIECEWISE",
        "disable_cache": True,
    }
    fields.update(changes)
    torch.manual_seed(0)
    model = SillyModel(compilation_config=CompilationConfig(**fields)).cuda()
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0)).cuda()
    return model, reference


def run(model, x):
    """``model(x)`` in a step as the model's ``GraphDispatcher`` describes it to a runner."""
    with GraphDispatcher.for_model(model).step(x.shape[0]):
        return model(x)


def test_six_cuda_graphs_for_two_sizes_and_results_match_eager(cuda_platform):
    model, reference = cuda_models()
    with counters.expect(num_graphs_captured=6):
        for size in (1, 2):
            buffer = torch.empty(size, 8, device="cuda")
            for _ in range(3):
                buffer.copy_(torch.randn(size, 8, device="cuda"))
                torch.testing.assert_close(run(model, buffer), reference(buffer))


def test_zeroed_buffer_replays_to_the_eager_result_for_zeros(cuda_platform):
    model, reference = cuda_models()
    buffer = torch.randn(2, 8, device="cuda")
    run(model, buffer)
    run(model, buffer)
    buffer.zero_()
    torch.testing.assert_close(run(model, buffer), reference(torch.zeros(2, 8, device="cuda")))


def test_fresh_tensor_raises_on_first_replay(cuda_platform):
    model, _ = cuda_models()
    buffer = torch.randn(2, 8, device="cuda")
    run(model, buffer)
    run(model, buffer)
    with pytest.raises(StaticGraphError, match=r"capture size \d+: input \d+ was captured"):
        run(model, torch.randn(2, 8, device="cuda"))


def test_graph_copy_inputs_takes_a_fresh_tensor_every_call(cuda_platform):
    model, reference = cuda_models(graph_copy_inputs=True)
    with counters.expect(num_graphs_captured=3):
        for _ in range(4):  # warm-up, capture, two replays
            x = torch.randn(2, 8, device="cuda")
            torch.testing.assert_close(run(model, x), reference(x))


def test_full_graph_on_cuda(cuda_platform):
    model, reference = cuda_models(graph_mode="FULL")
    buffer = torch.randn(2, 8, device="cuda")
    with counters.expect(num_graphs_captured=1):
        for _ in range(3):
            torch.testing.assert_close(run(model, buffer), reference(buffer))


def test_inductor_partitions_capture_cuda_graphs(cuda_platform):
    model, reference = cuda_models(use_inductor_graph_partition=True)
    captured = {}
    for size in (1, 2):
        before = counters.snapshot()["num_graphs_captured"]
        buffer = torch.empty(size, 8, device="cuda")
        # Partitions see no example inputs: their size comes from the batch descriptor.
        for _ in range(3):
            buffer.copy_(torch.randn(size, 8, device="cuda"))
            torch.testing.assert_close(run(model, buffer), reference(buffer))
        captured[size] = counters.snapshot()["num_graphs_captured"] - before
    assert captured[1] == captured[2] > 0, captured  # every partition, once per size
