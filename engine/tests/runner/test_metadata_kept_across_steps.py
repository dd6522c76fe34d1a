"""Attention metadata kept across steps: a runner hands every step of one shape the same
metadata object over its persistent buffers, rewritten in place, and backends keep
what they bound to its tensors (``AttentionMetadata.layout_cache``: TRITON_PAGED's
checked launches and each layer's KV copies and launches) from one step to the next.

What a user relies on: every step still gives eager's logits, whatever changed in
between (the batch's shape, which requests hold which block-table rows, a request's
blocks, the KV cache itself), and a KV cache that was replaced is not kept alive by
what was bound to it.  The recorded graph API replays on the captured tensors, so a call
bound to a stale tensor gives wrong logits.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from runner_cases import (  # noqa: F401 - the fixture is used by name
    Twins,
    _lazy_captures_after_each_test,
)

from slotwise.attention import AttentionMetadataBuilder, allocate_kv_caches
from slotwise.attention.metadata import next_step
from slotwise.compilation.static_graphs.contract import StaticGraphError
from slotwise_cpu.attention import CpuSdpaBackend
from slotwise_cuda.attention import TritonPagedBackend, TritonPagedImpl
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner

CASES = [
    ("TRITON_PAGED", "PIECEWISE"),
    ("TRITON_PAGED", "FULL_AND_PIECEWISE"),
    # Its per-step plan reads the metadata's values: kept across steps, it would go stale.
    ("CPU_SDPA", "PIECEWISE"),
]


@pytest.fixture
def twins_with(request, graph_platform_with):
    """``make(backend, graph_mode)``: Twins on the CPU graph platform with that backend
    (Triton's kernels in its interpreter)."""

    def make(backend: str, graph_mode: str) -> Twins:
        if backend == "TRITON_PAGED":
            request.getfixturevalue("interpreted_triton")
            graph_platform_with(TritonPagedBackend)
        else:
            graph_platform_with(CpuSdpaBackend)
        return Twins(graph_mode)

    return make


@pytest.mark.slow
@pytest.mark.parametrize("backend, graph_mode", CASES)
def test_steps_match_eager_as_the_shape_and_the_rows_change(twins_with, backend, graph_mode):
    twins = twins_with(backend, graph_mode)
    for name, prompt in (("a", [3, 1, 4]), ("b", [1, 5]), ("c", [9, 2, 6, 5])):
        twins.join(name, prompt)
    twins.step(["a", "b", "c"])
    for _ in range(14):  # decodes of 3, padded to 4; request c crosses a block boundary
        twins.step(["a", "b", "c"])
    twins.step(["a", "c"])  # two decodes: another shape, then back
    twins.step(["a", "b", "c"])
    twins.leave("b")
    twins.join("d", [7])  # the same shape, d on b's block-table row with other blocks
    for _ in range(3):
        twins.step(["a", "c", "d"])
    twins.join("e", [2, 7, 1])
    twins.join("f", [5, 3])
    twins.step(["a", "c", "d", "e", "f"])  # a mixed batch: 3 decodes, prefills of 3 and 2
    twins.join("g", [4, 4])
    twins.join("h", [6, 1, 6])
    twins.step(["a", "c", "d", "g", "h"])  # the same shape, prefills of 2 and 3
    for _ in range(2):
        twins.step(["a", "c", "d", "g", "h"])


@pytest.mark.slow
# A FULL graph captured the old caches' addresses: captures being lazy here, it is
# captured again over the new ones.
@pytest.mark.parametrize("backend, graph_mode", CASES)
def test_steps_after_the_kv_cache_is_reallocated_match_eager(twins_with, backend, graph_mode):
    twins = twins_with(backend, graph_mode)
    for name, prompt in (("a", [3, 1, 4]), ("b", [1, 5])):
        twins.join(name, prompt)
    for _ in range(6):  # the prefill, then decodes of 2 until they are recorded
        twins.step(["a", "b"])
    old = [weakref.ref(layer.kv_cache) for layer in attention_layers(twins.graph.model)]
    for name in ("a", "b"):
        twins.leave(name)
    for runner in twins.runners:
        allocate_kv_caches(runner.model, 32)
    # New requests whose decodes have the same shape (the kept metadata, launches and
    # recorded step were made over the old caches) and whose prefill has another, so
    # that what was kept for the old prefill's shape is not replaced by a later step.
    for name, prompt in (("c", [8, 8, 1, 1]), ("d", [2, 4])):
        twins.join(name, prompt)
    for _ in range(4):
        twins.step(["c", "d"])
    gc.collect()
    assert [ref() is None for ref in old] == [True] * len(old)


@pytest.mark.slow
def test_full_graphs_over_replaced_kv_caches_are_refused_until_captured_again(twins_with):
    twins = twins_with("TRITON_PAGED", "FULL_AND_PIECEWISE")
    twins.graph.capture(progress=False)  # the capture window closes after it
    for name, prompt in (("a", [3, 1, 4]), ("b", [1, 5])):
        twins.join(name, prompt)
    for _ in range(3):
        twins.step(["a", "b"])
    # Another model's caches leave this model's full graphs as they are.
    ModelRunner(build_llama("tiny", seed=1, compilation_config={"level": 0}), num_blocks=8)
    twins.step(["a", "b"])
    for runner in twins.runners:
        allocate_kv_caches(runner.model, 32)
    for name, prompt in (("c", [8, 8, 1]), ("d", [2, 4])):
        twins.join(name, prompt)
    twins.step(["c", "d"])  # a prefill: piecewise graphs, which never read the caches
    with pytest.raises(StaticGraphError) as refused:
        twins.step(["c", "d"])  # a uniform decode: the full graph of size 2
    assert "captured over KV caches that allocate_kv_caches has replaced" in str(refused.value)
    assert "ModelRunner.capture()" in str(refused.value)
    twins.graph.capture(progress=False)
    for _ in range(3):
        twins.step(["c", "d"])


def attention_layers(model: torch.nn.Module) -> list:
    return [module for module in model.modules() if hasattr(module, "attn_backend")]


def triton_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v and a KV cache of 4 blocks of 16 for two heads over one KV head."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 32, generator=generator)
    k, v = torch.randn(2, 2, 1, 32, generator=generator)
    cache = torch.randn(2, 4, 16, 1, 32, generator=generator)
    return q, k, v, cache


def triton_attention(metadata, q, k, v, cache, out, impl=None) -> torch.Tensor:
    impl = impl or TritonPagedImpl(num_heads=2, head_size=32, scale=32**-0.5, num_kv_heads=1)
    impl.forward(None, q, k, v, cache, metadata, out)
    return out


def decodes(builder: AttentionMetadataBuilder, contexts: list[int]):
    return builder.build([1, 1], contexts, [[0], [2]])


def test_calls_bound_to_a_metadata_object_follow_its_tensors(interpreted_triton):
    builder = AttentionMetadataBuilder(block_size=16)
    impl = TritonPagedImpl(num_heads=2, head_size=32, scale=32**-0.5, num_kv_heads=1)
    metadata = decodes(builder, [3, 5])
    q, k, v, cache = triton_inputs(0)
    out = torch.empty_like(q)
    triton_attention(metadata, q, k, v, cache, out, impl)  # binds to these tensors
    # The next step of the same shape, its values written into the same tensors.
    later = decodes(builder, [4, 9])
    for name in ("query_start_loc", "seq_lens", "slot_mapping", "block_table"):
        getattr(metadata, name).copy_(getattr(later, name))
    next_step(metadata, max_query_len=1, max_seq_len=10)
    other_q, _, _, other_cache = triton_inputs(1)
    # The same tensors, another cache, another q laid out the same way.
    for step_q, step_cache in ((q, cache), (q, other_cache), (other_q, other_cache)):
        expected_cache = step_cache.clone()
        expected = triton_attention(later, step_q, k, v, expected_cache, torch.empty_like(q))
        got = triton_attention(metadata, step_q, k, v, step_cache, out, impl)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert torch.equal(step_cache, expected_cache)  # the keys and values went there


def test_a_kv_cache_whose_memory_was_swapped_in_place_is_bound_again(interpreted_triton):
    builder = AttentionMetadataBuilder(block_size=16)
    impl = TritonPagedImpl(num_heads=2, head_size=32, scale=32**-0.5, num_kv_heads=1)
    metadata = decodes(builder, [3, 5])
    q, k, v, cache = triton_inputs(0)
    out = torch.empty_like(q)
    triton_attention(metadata, q, k, v, cache, out, impl)
    _, _, _, other = triton_inputs(1)
    cache.set_(other.clone())  # the same tensor object, other memory
    expected = triton_attention(decodes(builder, [3, 5]), q, k, v, other, torch.empty_like(q))
    got = triton_attention(metadata, q, k, v, cache, out, impl)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
