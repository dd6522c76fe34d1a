"""StaticAttentionMetadata: the layouts full graphs read, refilled in place every step."""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import AttentionMetadataBuilder, StaticAttentionMetadata

BLOCK_SIZE = 4
SCRATCH = 9


def static(max_tokens: int = 8, max_blocks: int = 3) -> StaticAttentionMetadata:
    return StaticAttentionMetadata(max_tokens, max_blocks, BLOCK_SIZE, SCRATCH, "cpu")


def build(query_lens, context_lens, block_ids):
    return AttentionMetadataBuilder(BLOCK_SIZE).build(query_lens, context_lens, block_ids)


def test_uniform_decode_pads_with_one_token_requests_on_the_scratch_block():
    metadata = static().uniform_decode(4, build([1, 1], [5, 2], [[3, 4], [7]]))
    scratch_slot = SCRATCH * BLOCK_SIZE
    assert metadata.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert metadata.seq_lens.tolist() == [6, 3, 1, 1]
    assert metadata.slot_mapping.tolist() == [4 * 4 + 1, 7 * 4 + 2, scratch_slot, scratch_slot]
    assert metadata.block_table[:2, :2].tolist() == [[3, 4], [7, 0]]
    assert metadata.block_table[2:, 0].tolist() == [SCRATCH, SCRATCH]
    assert (metadata.num_actual_tokens, metadata.num_decodes, metadata.num_prefills) == (4, 4, 0)
    assert metadata.max_query_len == 1


def test_general_layout_adds_padding_requests_then_empty_ones():
    # A decode of 1 token and a prefill of 3: 4 tokens padded to 6.
    metadata = static().general(6, build([1, 3], [3, 0], [[2], [5]]))
    assert metadata.query_start_loc.tolist() == [0, 1, 4, 5, 6, 6, 6]
    assert metadata.seq_lens.tolist() == [4, 3, 1, 1, 0, 0]
    assert metadata.slot_mapping.tolist()[4:] == [SCRATCH * BLOCK_SIZE] * 2
    assert metadata.block_table[2:4, 0].tolist() == [SCRATCH, SCRATCH]
    # The decode/prefill split of a step cannot be baked into a graph: all are prefills.
    assert (metadata.num_decodes, metadata.num_prefills, metadata.num_prefill_tokens) == (0, 6, 6)


def test_counts_and_addresses_depend_only_on_the_padded_size():
    buffers = static()
    first = buffers.uniform_decode(4, build([1, 1, 1], [1, 2, 3], [[1], [2], [3]]))
    second = buffers.uniform_decode(4, build([1], [6], [[4, 5]]))
    for name in ("query_start_loc", "seq_lens", "slot_mapping", "block_table"):
        assert getattr(first, name).data_ptr() == getattr(second, name).data_ptr(), name
    assert (first.num_actual_tokens, first.max_seq_len) == (second.num_actual_tokens, 12)
    # Rows the previous, larger step used are padding requests again.
    assert second.seq_lens.tolist() == [7, 1, 1, 1]
    assert second.block_table[1:, 0].tolist() == [SCRATCH] * 3


def test_a_step_without_metadata_is_all_padding():
    metadata = static().uniform_decode(2, None)
    assert metadata.seq_lens.tolist() == [1, 1]
    assert metadata.block_table[:, 0].tolist() == [SCRATCH, SCRATCH]


def test_prefills_in_a_uniform_decode_step_are_an_error():
    with pytest.raises(
        ValueError, match="1 request.* more than one new token.*uniform_decode=False"
    ):
        static().uniform_decode(4, build([1, 2], [3, 0], [[1], [2]]))


@pytest.mark.parametrize(
    "padded, metadata, message",
    [
        (16, None, "size 16 exceeds the static metadata's 8 tokens"),
        (2, build([3], [0], [[1]]), "3 tokens .* does not fit static metadata padded to 2"),
        (4, build([1], [12], [[1, 2, 3, 4]]), "4 blocks per request does not fit .* at most 3"),
    ],
)
def test_steps_that_do_not_fit_are_errors(padded, metadata, message):
    with pytest.raises(ValueError, match=message):
        static().general(padded, metadata)


def test_buffers_live_on_the_given_device_with_the_builders_dtypes():
    metadata = static().general(2, None)
    built = build([1], [0], [[1]])
    for name in ("query_start_loc", "seq_lens", "slot_mapping", "block_table"):
        assert getattr(metadata, name).dtype == getattr(built, name).dtype, name
    assert metadata.seq_lens.device == torch.device("cpu")
