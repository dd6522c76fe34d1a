"""What ``AttentionMetadata`` works out once per step for every layer: the decode/prefill
views, the per-step cache, and the request tensors made by one host-to-device copy."""

from __future__ import annotations

import dataclasses

import torch

from slotwise.attention import AttentionMetadataBuilder

BLOCK_SIZE = 4


def mixed_metadata():
    # Two decodes, then prefills of 3 and 2 tokens; blocks as the requests need them.
    return AttentionMetadataBuilder(BLOCK_SIZE).build(
        [1, 1, 3, 2], [4, 6, 0, 5], [[0, 1], [2, 3], [4], [5, 6]]
    )


def test_split_views_are_the_decode_head_and_the_prefill_tail():
    metadata = mixed_metadata()
    split = metadata.split
    assert split.decode_seq_lens.tolist() == [5, 7]
    assert split.decode_block_table.tolist() == [[0, 1], [2, 3]]
    assert split.prefill_seq_lens.tolist() == [3, 7]
    assert split.prefill_block_table.tolist() == [[4, 0], [5, 6]]
    # The prefills' rows counted from their first token (row 2 of the batch).
    assert split.prefill_query_start_loc.tolist() == [0, 3, 5]
    assert metadata.split is split  # once per step, not once per layer


def test_a_batch_of_decodes_only_needs_no_prefill_offsets():
    metadata = AttentionMetadataBuilder(BLOCK_SIZE).build([1, 1], [2, 3], [[0], [1]])
    split = metadata.split
    assert split.prefill_seq_lens.numel() == 0
    assert split.prefill_query_start_loc.tolist() == [2]


def test_request_tensors_start_on_16_byte_boundaries_and_hold_their_values():
    metadata = mixed_metadata()
    tensors = (metadata.query_start_loc, metadata.seq_lens, metadata.block_table)
    assert all(t.dtype == torch.int32 and t.data_ptr() % 16 == 0 for t in tensors)
    assert metadata.query_start_loc.tolist() == [0, 1, 2, 5, 7]
    assert metadata.seq_lens.tolist() == [5, 7, 3, 7]
    assert metadata.block_table.is_contiguous() and metadata.block_table.shape == (4, 2)
    assert metadata.slot_mapping.tolist() == [4, 14, 16, 17, 18, 25, 26]


def test_each_metadata_object_has_its_own_step_cache():
    metadata = mixed_metadata()
    metadata.step_cache["bound"] = object()
    copy = dataclasses.replace(metadata, num_actual_tokens=metadata.num_actual_tokens)
    assert copy.step_cache == {}
    assert mixed_metadata().step_cache == {}
