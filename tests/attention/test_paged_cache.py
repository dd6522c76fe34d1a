"""The paged KV cache bookkeeping: block allocation, slot mapping, metadata building."""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import (
    AttentionMetadataBuilder,
    BlockAllocator,
    OutOfBlocksError,
    compute_slot_mapping,
    write_to_kv_cache,
)


def test_slot_mapping_follows_the_block_table():
    # Positions 6..9 with block size 4 live in blocks 9 (offsets 2, 3) and 2 (0, 1).
    assert compute_slot_mapping([5, 9, 2], 6, 10, 4) == [38, 39, 8, 9]


def test_builder_lays_out_a_mixed_batch():
    builder = AttentionMetadataBuilder(block_size=4)
    metadata = builder.build(
        query_lens=[1, 1, 3],
        context_lens=[4, 0, 2],
        block_ids=[[7, 3], [1], [0, 6]],
    )
    assert metadata.num_actual_tokens == 5
    assert metadata.query_start_loc.tolist() == [0, 1, 2, 5]
    assert metadata.seq_lens.tolist() == [5, 1, 5]
    assert metadata.slot_mapping.tolist() == [12, 4, 2, 3, 24]
    assert metadata.block_table.tolist() == [[7, 3], [1, 0], [0, 6]]
    assert metadata.query_start_loc.dtype == metadata.seq_lens.dtype == torch.int32
    assert metadata.block_table.dtype == torch.int32
    assert metadata.slot_mapping.dtype == torch.int64
    assert (metadata.max_query_len, metadata.max_seq_len) == (3, 5)
    assert (metadata.num_decodes, metadata.num_decode_tokens) == (2, 2)
    assert (metadata.num_prefills, metadata.num_prefill_tokens) == (1, 3)
    assert metadata.num_reqs == 3


def test_builder_accepts_tensors():
    metadata = AttentionMetadataBuilder(block_size=2).build(
        torch.tensor([2]), torch.tensor([1]), torch.tensor([[4, 5]])
    )
    assert metadata.slot_mapping.tolist() == [9, 10]


@pytest.mark.parametrize(
    "query_lens, context_lens, block_ids, message",
    [
        ([3, 1], [0, 5], [[0], [1, 2]], "decodes .* after a prefill"),
        ([3], [3], [[0]], "need 2 blocks of 4, but has 1"),
        ([0], [0], [[0]], "query_len 0 must be >= 1"),
        ([1, 1], [0], [[0], [1]], "one per request"),
    ],
)
def test_builder_rejects_batches_backends_cannot_run(query_lens, context_lens, block_ids, message):
    with pytest.raises(ValueError, match=message):
        AttentionMetadataBuilder(block_size=4).build(query_lens, context_lens, block_ids)


def test_allocator_grows_requests_and_recycles_blocks():
    allocator = BlockAllocator(num_blocks=4, block_size=4)
    first = allocator.allocate(5)
    assert first == [0, 1]
    assert allocator.allocate(8, first) is first and first == [0, 1]
    second = allocator.allocate(8)
    assert second == [2, 3]
    with pytest.raises(OutOfBlocksError, match="only 0 of 4 are free"):
        allocator.allocate(13, second)
    allocator.free(first)
    assert allocator.num_free_blocks == 2
    assert allocator.allocate(13, second) == [2, 3, 0, 1]
    allocator.free(second)
    with pytest.raises(ValueError, match="not allocated"):
        allocator.free([0])


def test_write_to_kv_cache_puts_each_token_in_its_slot():
    kv_cache = torch.zeros(2, 3, 4, 2, 8)
    key, value = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    write_to_kv_cache(key, value, kv_cache, torch.tensor([9, 2]))
    assert torch.equal(kv_cache[0, 2, 1], key[0]) and torch.equal(kv_cache[1, 0, 2], value[1])
    assert kv_cache.count_nonzero() == 2 * 2 * 2 * 8  # (key, value) x tokens x heads x dims
