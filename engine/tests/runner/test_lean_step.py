"""The lean piecewise step on the CPU graph API: the same logits as eager, whatever the batch.

What a step shares across its layers is worked out once (the decode/prefill views, the
checked and configured kernel launches), so these tests run every kind of step a
runner makes through the piecewise graphs and compare it with an eager twin: first
calls of a size (warm-up, capture, first replay), padded sizes, mixed batches.
"""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import AttentionMetadataBuilder
from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise_cpu.attention import CpuSdpaBackend
from slotwise_cuda.attention import TritonPagedBackend, TritonPagedImpl
from slotwise_engine.models.llama import LlamaConfig, build_llama
from slotwise_engine.runner.model_runner import ModelRunner

#: The tiny preset with head size 32, which the Triton kernels take.
TINY_HEAD_32 = LlamaConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1
)
SIZES = [1, 2, 4, 8]


@pytest.fixture(autouse=True)
def _lazy_captures_after_each_test():
    yield
    reset_capture_window()


@pytest.fixture(params=["CPU_SDPA", "TRITON_PAGED"])
def backend(request, graph_platform_with):
    """Each backend on the CPU graph platform (Triton's kernels in its interpreter)."""
    if request.param == "TRITON_PAGED":
        request.getfixturevalue("interpreted_triton")
        graph_platform_with(TritonPagedBackend)
    else:
        graph_platform_with(CpuSdpaBackend)
    return request.param


def twins() -> tuple[ModelRunner, ModelRunner]:
    """A runner with piecewise graphs, captured lazily (no capture step), and its eager twin."""
    config = CompilationConfig(
        level=3, backend="eager", capture_sizes=SIZES, graph_mode="PIECEWISE"
    )
    graphs = ModelRunner(
        build_llama(TINY_HEAD_32, seed=0, compilation_config=config), num_blocks=32
    )
    eager = build_llama(TINY_HEAD_32, seed=0, compilation_config=CompilationConfig(level=0))
    return graphs, ModelRunner(eager, num_blocks=32)


def step_both(runners: tuple[ModelRunner, ModelRunner], requests: list, tokens: list[int]):
    """One step of both runners over their own copies of the requests; the graphs' logits."""
    (graphs, eager), (ours, theirs) = runners, requests
    expected = eager.step(theirs)
    logits = graphs.step(ours)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    for own, twin, token in zip(ours, theirs, tokens, strict=True):
        own.tokens.append(token)
        twin.tokens.append(token)
    return logits


def add_both(runners, prompts: list[list[int]], max_new_tokens: int) -> tuple[list, list]:
    return tuple(runner.add_requests(prompts, max_new_tokens) for runner in runners)


@pytest.mark.parametrize("batch", [1, 2])
def test_first_calls_of_a_size_match_eager(backend, batch):
    # Decodes of `batch` tokens: a warm-up, the capture, the first (checked) replay, a
    # plain replay, all of size `batch`.
    runners = twins()
    requests = add_both(runners, [[3, 1, 4, 1, 5][: 3 + r] for r in range(batch)], 6)
    step_both(runners, requests, [7] * batch)  # the prefill
    with counters.expect(num_graphs_captured=TINY_HEAD_32.num_layers + 1):
        for token in (9, 2, 6, 5):
            step_both(runners, requests, [token] * batch)


def test_padded_sizes_match_eager(backend):
    # 3 decodes run as 4 rows, 5 as 8: the padding rows must not leak into the real ones.
    runners = twins()
    for batch in (3, 5):
        requests = add_both(runners, [[r + 1, 2 * r + 3] for r in range(batch)], 5)
        step_both(runners, requests, list(range(10, 10 + batch)))
        for token in (4, 8, 15, 16):
            step_both(runners, requests, [token] * batch)
        for runner, own in zip(runners, requests, strict=True):
            runner.free(own)


def test_mixed_batches_match_eager(backend):
    # Decodes and prefills in one step, padded to a capture size, in the callers' order.
    runners = twins()
    old = add_both(runners, [[5, 6, 7], [8, 9]], 6)
    step_both(runners, old, [1, 2])
    for step in range(3):
        new = add_both(runners, [[20 + step, 21, 22]], 4)
        # New requests first: the runner reorders the batch to [decodes..., prefills...].
        mixed = tuple(n + o for n, o in zip(new, old, strict=True))
        step_both(runners, mixed, [30 + step, 40 + step, 50 + step])


def test_the_launch_is_checked_once_per_step_shape_not_per_layer_or_step(
    graph_platform_with, interpreted_triton
):
    from slotwise_cuda.kernels import attention as kernels

    graph_platform_with(TritonPagedBackend)
    runners = twins()
    requests = add_both(runners, [[1, 2, 3], [4, 5]], 4)
    step_both(runners, requests, [6, 7])
    step_both(runners, requests, [8, 8])  # the first decode of this shape binds
    bindings = 0
    original = kernels.PagedAttentionLaunch.__init__

    def counting(self, *args, **kwargs):
        nonlocal bindings
        bindings += 1
        original(self, *args, **kwargs)

    kernels.PagedAttentionLaunch.__init__ = counting
    try:
        for token in (9, 10, 11):
            step_both(runners, requests, [token, token])
    finally:
        kernels.PagedAttentionLaunch.__init__ = original
    # The graph runner hands every decode step of two requests the same metadata (views
    # of its persistent buffers), so its binding holds for all of them; the eager twin
    # makes metadata per step and binds once per step, shared by the model's two
    # layers: 3 steps, where one per layer and step would make 12.
    assert TINY_HEAD_32.num_layers == 2
    assert bindings == 3


def test_a_layer_laid_out_differently_is_still_checked(interpreted_triton):
    # The first layer's binding is reused only for tensors laid out the same way: a
    # layer whose q has another dtype gets its own checks, and they refuse it.
    impl = TritonPagedImpl(num_heads=2, head_size=32, scale=32**-0.5, num_kv_heads=1)
    metadata = AttentionMetadataBuilder(block_size=16).build([1, 1], [3, 5], [[0], [1]])
    kv_cache = torch.zeros(2, 4, 16, 1, 32)
    q, k = torch.randn(2, 2, 32), torch.randn(2, 1, 32)
    impl.forward(None, q, k, k, kv_cache, metadata, torch.empty_like(q))
    assert len(metadata.layout_cache) == 2  # the shared launch, the layer's calls
    with pytest.raises(ValueError, match=r"k_cache: expected dtype in \(float16\)"):
        wrong = q.half()
        impl.forward(None, wrong, k, k, kv_cache, metadata, torch.empty_like(wrong))
