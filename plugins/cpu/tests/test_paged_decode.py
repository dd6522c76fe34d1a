"""The CPU plugin's decode attention kernel (``slotwise_cpu.paged_decode``).

The oracle is attention computed in float64 by torch from a dense copy of each
request's keys and values (gathered by hand from its block table), softmax and all.
The kernel computes in float32 from the cache's dtype, so in float32 it must agree to
float32 rounding, and in bfloat16/float16 its output may differ from the oracle's by the
rounding of the result to that dtype only (the inputs are exact in both).
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_oracles import (
    assert_matches,
    float64_reference,
    paged_cache,
    shuffled_block_table,
)

from slotwise.attention import AttentionMetadataBuilder
from slotwise_cpu import paged_decode
from slotwise_cpu.attention import CpuSdpaImpl
from slotwise_cpu.paged_decode import paged_decode_op

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: (heads, kv heads, head size, block size): the specialised head sizes 64 and 128 (with
#: the grouped-query ratios 2 and 4 the kernel specialises, and others), a
#: generic one (80, 20), grouped-query ratios 1 to 16, block sizes that tiles cross.
#: Where the CPU has AMX, bfloat16 keys go to tiles when every query head fits one (at
#: most 16), the head is whole 32-element chunks and blocks whole 16-token tiles: the
#: first three, and (4, 2, 96, 32) and (16, 16, 32, 16) for the chunk counts between.
#: Without AMX but with AVX512-BF16, the first three score bfloat16 keys in its pairwise
#: dot products.
LAYOUTS = [
    (8, 4, 64, 16), (16, 4, 64, 16), (8, 4, 128, 16), (32, 2, 128, 16), (6, 2, 80, 5),
    (3, 3, 20, 32), (16, 1, 64, 1), (4, 2, 96, 32), (16, 16, 32, 16), (4, 2, 256, 16),
    (16, 4, 128, 16),
]  # fmt: skip
#: Lengths around the 512-token partitions the kernel splits requests into (each scored,
#: then summed, then merged with the others of its request), and a last partition short.
LENGTHS = [1, 17, 255, 511, 512, 513, 1200]


@pytest.fixture(scope="module")
def kernel():
    assert paged_decode.available(), "the kernels must build where C and C++ compilers are"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "h{}-kv{}-d{}-b{}".format(*layout))
def test_the_kernel_matches_float64_attention(kernel, dtype, layout):
    heads, kv_heads, head_size, block_size = layout
    generator = torch.Generator().manual_seed(heads * head_size + block_size)
    num_blocks = 3 * math.ceil(max(LENGTHS) / block_size) + 8
    kv_cache = paged_cache(num_blocks, block_size, kv_heads, head_size, dtype, generator)
    table = shuffled_block_table(LENGTHS, block_size, num_blocks, generator)
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    q = (3 * torch.randn(len(LENGTHS), heads, head_size, generator=generator)).to(dtype)
    out = torch.empty_like(q)
    paged_decode_op(q, kv_cache, table, lengths, out, 0.37)
    assert_matches(out, float64_reference(q, *kv_cache, table, LENGTHS, 0.37))


def test_queries_may_be_rows_of_a_wider_tensor(kernel):
    """q as the model makes it: a view into the fused qkv projection (strided rows)."""
    generator = torch.Generator().manual_seed(1)
    kv_cache = paged_cache(40, 16, 2, 64, torch.float32, generator)
    table = shuffled_block_table([33, 70], 16, 40, generator)
    qkv = torch.randn(2, (8 + 2 * 2) * 64, generator=generator)
    q = qkv[:, : 8 * 64].view(2, 8, 64)
    out = torch.empty(2, 8, 64)
    paged_decode_op(q, kv_cache, table, torch.tensor([33, 70], dtype=torch.int32), out, 0.125)
    assert_matches(out, float64_reference(q, *kv_cache, table, [33, 70], 0.125))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_new_tokens_are_stored_before_they_are_attended_to(kernel, dtype):
    generator = torch.Generator().manual_seed(2)
    kv_cache = torch.zeros(2, 12, 2, 16, 32, dtype=dtype)
    builder = AttentionMetadataBuilder(16)
    metadata = builder.build([1, 1], [20, 40], [[3, 7], [1, 9, 4]])
    k, v = (torch.randn(2, 2, 32, generator=generator).to(dtype) for _ in range(2))
    stale = torch.randn(kv_cache.shape, generator=generator).to(dtype)
    kv_cache.copy_(stale)
    expected_cache = stale.clone()
    # Token 20 of request 0 in its second block (7), token 40 of request 1 in its third (4).
    assert metadata.slot_mapping.tolist() == [7 * 16 + 4, 4 * 16 + 8]
    for i, (block, offset) in enumerate([(7, 4), (4, 8)]):
        expected_cache[0, block, :, offset] = k[i]
        expected_cache[1, block, :, offset] = v[i]
    q = torch.randn(2, 4, 32, generator=generator).to(dtype)
    out = torch.empty_like(q)
    paged_decode_op(q, kv_cache, metadata.block_table, metadata.seq_lens, out, 0.2,
        k, v, metadata.slot_mapping,
    )  # fmt: skip
    assert torch.equal(kv_cache, expected_cache)
    lengths = metadata.seq_lens.tolist()
    expected = float64_reference(q, *expected_cache.unbind(0), metadata.block_table, lengths, 0.2)
    assert_matches(out, expected)


@pytest.mark.parametrize(
    "change, message",
    [
        ("block", "block id or slot outside the cache"),
        ("negative block", "block id or slot outside the cache"),
        ("length", "longer than its block table row"),
        ("slot", "block id or slot outside the cache"),
    ],
)
def test_out_of_range_ids_are_refused_not_read(kernel, change, message):
    kv_cache = torch.zeros(2, 4, 1, 16, 8)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    lengths = torch.tensor([20], dtype=torch.int32)
    new_kv = ()
    if change == "block":
        table[0, 1] = 4
    elif change == "negative block":
        table[0, 0] = -1
    elif change == "length":
        lengths[0] = 33
    else:
        new_kv = (torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.tensor([64]))
    q = out = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match=message):
        paged_decode_op(q, kv_cache, table, lengths, out, 1.0, *new_kv)


def test_layouts_the_kernel_cannot_read_are_refused(kernel):
    kv_cache = torch.zeros(2, 4, 1, 16, 8)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    lengths = torch.tensor([20], dtype=torch.int32)
    heads_last = torch.zeros(1, 8, 2).transpose(1, 2)  # [1, 2, 8], heads not contiguous
    with pytest.raises(ValueError, match="heads contiguous"):
        paged_decode_op(heads_last, kv_cache, table, lengths, torch.zeros(1, 2, 8), 1.0)
    with pytest.raises(ValueError, match="the cache.s dtype"):
        paged_decode_op(
            torch.zeros(1, 2, 8, dtype=torch.bfloat16), kv_cache, table, lengths,
            torch.zeros(1, 2, 8, dtype=torch.bfloat16), 1.0,
        )  # fmt: skip


def test_caches_and_head_sizes_the_kernel_cannot_read_are_refused(kernel):
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    lengths = torch.tensor([20], dtype=torch.int32)
    q = out = torch.zeros(1, 2, 8)
    tokens_first = torch.zeros(2, 4, 16, 2, 8).transpose(2, 3)  # [2, 4, 2, 16, 8], strided
    with pytest.raises(ValueError, match="contiguous CPU KV cache"):
        paged_decode_op(q, tokens_first, table, lengths, out, 1.0)
    halves = torch.zeros(4, 2, 16, 8)  # one half of a cache, not keys and values
    with pytest.raises(ValueError, match="contiguous CPU KV cache"):
        paged_decode_op(q, halves, table, lengths, out, 1.0)
    wider = torch.zeros(2, 4, 2, 16, 16)  # head size 16 against the query's 8
    with pytest.raises(ValueError, match="head size"):
        paged_decode_op(q, wider, table, lengths, out, 1.0)


def test_a_token_major_cache_is_refused_with_the_layout_named(kernel):
    """The core's default layout [2, blocks, block size, kv heads, D] has the same rank;
    read as head-major, its block size would be taken for the key/value heads."""
    q = out = torch.zeros(1, 8, 64)
    token_major = torch.zeros(2, 4, 16, 4, 64)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    lengths = torch.tensor([20], dtype=torch.int32)
    with pytest.raises(ValueError, match="16 key/value heads, which do not divide the query's 8"):
        paged_decode_op(q, token_major, table, lengths, out, 1.0)


@pytest.mark.parametrize("slot", [-1, 4 * 16])
def test_a_prefill_slot_outside_the_cache_is_refused_not_wrapped(slot):
    """A mixed batch's tokens are stored by indexing (the kernel stores only decodes'):
    a negative slot must not land in the last block."""
    impl = CpuSdpaImpl(2, 8, 1.0, 2)
    metadata = AttentionMetadataBuilder(16).build([3], [0], [[0]])
    metadata.slot_mapping[1] = slot
    kv_cache = torch.zeros(2, 4, 2, 16, 8)
    q, out = torch.randn(3, 2, 8), torch.empty(3, 2, 8)
    k = v = torch.randn(3, 2, 8)
    with pytest.raises(IndexError, match=f"slots {min(slot, 0)} to {max(slot, 2)}, outside"):
        impl.forward(None, q, k, v, kv_cache, metadata, out)
    assert not kv_cache.any()


def test_a_layer_checks_each_new_cache_it_is_given(kernel):
    """A cache swapped in later (the runner reallocated) is checked as the first was,
    not read on trust."""
    impl = CpuSdpaImpl(2, 8, 1.0, 2)
    metadata = AttentionMetadataBuilder(16).build([1], [19], [[0, 1]])
    q, out = torch.randn(1, 2, 8), torch.empty(1, 2, 8)
    k = v = torch.randn(1, 2, 8)
    impl.forward(None, q, k, v, torch.zeros(2, 4, 2, 16, 8), metadata, out)
    assert torch.isfinite(out).all()
    bad = torch.zeros(2, 4, 16, 2, 8).transpose(2, 3)  # same shape, not contiguous
    with pytest.raises(ValueError, match="contiguous CPU KV cache"):
        impl.forward(None, q, k, v, bad, metadata, out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 1, 5]], ids=["decodes", "mixed"])
def test_the_cpu_backend_decodes_through_the_kernel(kernel, dtype, query_lens):
    """Decodes (and a prefill after them) through CPU_SDPA's forward, against float64
    attention of each query token over the tokens up to its own, as the cache holds
    them afterwards."""
    generator = torch.Generator().manual_seed(3)
    heads, kv_heads, head_size, block_size = 8, 2, 64, 16
    impl = CpuSdpaImpl(heads, head_size, 0.125, kv_heads)
    kv_cache = torch.randn(2, 40, kv_heads, block_size, head_size, generator=generator).to(dtype)
    contexts = [300, 5, 47]
    metadata = AttentionMetadataBuilder(block_size).build(
        query_lens, contexts, [list(range(0, 19)), [19], [20, 21, 22, 23]]
    )
    num_tokens = metadata.num_actual_tokens
    q = torch.randn(num_tokens, heads, head_size, generator=generator).to(dtype)
    k, v = (torch.randn(num_tokens, kv_heads, head_size, generator=generator).to(dtype)
            for _ in range(2))  # fmt: skip
    out = torch.empty_like(q)
    impl.forward(None, q, k, v, kv_cache, metadata, out)
    # Token i of request r sits at position contexts[r] + i and sees positions 0 to it.
    rows = [(r, contexts[r] + i + 1) for r, n in enumerate(query_lens) for i in range(n)]
    table = metadata.block_table[[r for r, _ in rows]]
    expected = float64_reference(q, *kv_cache.unbind(0), table, [n for _, n in rows], 0.125)
    assert_matches(out, expected)


def test_torch_and_the_kernels_share_one_openmp_runtime(kernel):
    """The kernels link ``libgomp.so.1``; the loader must reuse the one torch loaded,
    or two thread pools would fight for the cores."""
    from slotwise_cpu import native

    assert native.load_kernels() is not None
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(runtimes) == 1, runtimes
