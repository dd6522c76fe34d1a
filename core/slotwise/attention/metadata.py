"""``AttentionMetadata``: where each token of a step lives in the paged KV cache.

The batch is laid out as ``[decodes..., prefills...]``: requests with one query token
come first, so a backend can run a decode kernel on the head of the batch and a
prefill kernel on the tail without gathering.  The builder turns the scheduler's
per-request view (query length, tokens already cached, block ids) into tensors
(``build``), or describes a step a runner wrote into buffers it keeps across steps
(``from_buffers``: views of them, nothing copied).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from slotwise.attention.kv_cache import compute_slot_mapping, num_blocks_for
from slotwise.platforms import current_platform


@dataclass
class AttentionMetadata:
    """Per-step attention inputs shared by every layer using the same KV cache layout."""

    #: Real tokens in the step; inputs may be padded beyond this (static graphs).
    num_actual_tokens: int
    #: int32 [num_reqs + 1]: request r's query tokens are rows
    #: ``query_start_loc[r]:query_start_loc[r + 1]`` of q, k, v and out.
    query_start_loc: torch.Tensor
    #: int32 [num_reqs]: tokens in the cache after this step (context + query).
    seq_lens: torch.Tensor
    #: int64 [num_actual_tokens]: cache slot (block_id * block_size + offset) of each token.
    slot_mapping: torch.Tensor
    #: int32 [num_reqs, max_blocks]: request r's i-th block; rows padded with block 0.
    block_table: torch.Tensor
    #: Largest query length (new tokens of one request) in the step.
    max_query_len: int
    #: Largest of ``seq_lens``.
    max_seq_len: int
    #: Requests with more than one query token; they follow the decodes.
    num_prefills: int
    #: Query tokens of the prefills (rows ``num_decode_tokens:num_actual_tokens``).
    num_prefill_tokens: int
    #: Requests with exactly one query token; they come first in the batch.
    num_decodes: int
    #: Query tokens of the decodes (equal to ``num_decodes``; rows ``:num_decode_tokens``).
    num_decode_tokens: int
    #: What a backend derives from this metadata for one layer and every other layer
    #: reuses: one metadata object serves all layers of a step, so whatever is stored
    #: here (values read from the tensors, checked argument layouts) is worked out once
    #: per step.  Emptied when the object serves another step (``next_step``).
    step_cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: What a backend derives from the metadata's tensors as objects (their shapes,
    #: strides, addresses, views of them), never from what they hold: kept across
    #: steps for as long as a runner reuses this object, i.e. for steps of the same
    #: shape over the same buffers, whose contents it rewrites in place (bound kernel
    #: launches, per-layer plans).  Whatever is kept here is checked against the tensors
    #: of each call (q, the KV cache, ...) before it is used.
    layout_cache: dict[Any, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def num_reqs(self) -> int:
        return self.num_decodes + self.num_prefills

    @functools.cached_property
    def split(self) -> BatchSplit:
        """The decode head and the prefill tail of the batch as views, sliced once per
        step instead of once per layer."""
        decodes = self.num_decodes
        prefill_starts = self.query_start_loc[decodes:]
        return BatchSplit(
            decode_block_table=self.block_table[:decodes],
            decode_seq_lens=self.seq_lens[:decodes],
            prefill_block_table=self.block_table[decodes:],
            prefill_seq_lens=self.seq_lens[decodes:],
            prefill_query_start_loc=(
                prefill_starts - decodes if decodes and self.num_prefills else prefill_starts
            ),
        )


def next_step(metadata: AttentionMetadata, *, max_query_len: int, max_seq_len: int) -> None:
    """Make ``metadata`` serve the next step of its shape, whose values were written into
    its tensors in place: that step's largest query and sequence lengths, an empty
    ``step_cache``; its ``layout_cache`` and ``split`` stay (the split's views, and its
    prefills' query starts rewritten in place)."""
    metadata.max_query_len = max_query_len
    metadata.max_seq_len = max_seq_len
    metadata.step_cache.clear()
    split = metadata.__dict__.get("split")
    decodes = metadata.num_decodes
    if split is not None and decodes and metadata.num_prefills:
        # The one part of the split computed from values rather than viewed: computed
        # again, in place, where launches bound to it read it (made in a step's
        # inference mode, it may be an inference tensor).
        starts = split.prefill_query_start_loc
        with torch.inference_mode():
            torch.sub(metadata.query_start_loc[decodes:], decodes, out=starts)


Array = TypeVar("Array")


@dataclass(frozen=True)
class MetadataBuffers(Generic[Array]):
    """The per-step arrays of ``AttentionMetadata`` at their largest, allocated once and
    rewritten in place (device tensors, or the host arrays they are copied from): a step
    uses the first rows of each."""

    #: int32 [max_reqs + 1]
    query_start_loc: Array
    #: int32 [max_reqs]
    seq_lens: Array
    #: int64 [max_tokens]
    slot_mapping: Array
    #: int32 [max_reqs, max_blocks_per_request]: the width never changes.
    block_table: Array


@dataclass(frozen=True)
class BatchSplit:
    """``AttentionMetadata.split``: the per-request tensors of the decodes (rows
    ``:num_decodes``) and of the prefills (the rest), for a kernel per part."""

    decode_block_table: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_block_table: torch.Tensor
    prefill_seq_lens: torch.Tensor
    #: int32 [num_prefills + 1]: the prefills' query rows, counted from the first of them.
    prefill_query_start_loc: torch.Tensor


class AttentionMetadataBuilder:
    """Builds ``AttentionMetadata``; backends needing more fields subclass it."""

    def __init__(self, block_size: int, device: torch.device | str | None = None) -> None:
        """``device``: where the metadata's tensors go, default the current platform's
        (where ``allocate_kv_caches`` puts the caches the metadata indexes)."""
        self.block_size = block_size
        self.device = torch.device(device or current_platform.device_type)

    def build(
        self,
        query_lens: Sequence[int] | torch.Tensor,
        context_lens: Sequence[int] | torch.Tensor,
        block_ids: Sequence[Sequence[int]] | torch.Tensor,
    ) -> AttentionMetadata:
        """Metadata for one step; request r has ``query_lens[r]`` new tokens after
        ``context_lens[r]`` cached ones, stored in blocks ``block_ids[r]`` in order.

        Decode requests (query length 1) must come before prefills.
        """
        queries = _ints(query_lens)
        contexts = _ints(context_lens)
        blocks = [_ints(row) for row in block_ids]
        if not len(queries) == len(contexts) == len(blocks):
            raise ValueError(
                f"query_lens, context_lens and block_ids have {len(queries)}, "
                f"{len(contexts)} and {len(blocks)} entries; give one per request"
            )
        self._check(queries, contexts, blocks)
        num_decodes = sum(1 for q in queries if q == 1)
        seq_lens = [c + q for c, q in zip(contexts, queries, strict=True)]
        starts = [0]
        slots: list[int] = []
        for query_len, context_len, row in zip(queries, contexts, blocks, strict=True):
            starts.append(starts[-1] + query_len)
            slots += compute_slot_mapping(
                row, context_len, context_len + query_len, self.block_size
            )
        width = max((len(row) for row in blocks), default=0)
        table = [block for row in blocks for block in row + [0] * (width - len(row))]
        num_tokens = starts[-1]
        query_start_loc, seq_lens_tensor, flat_table = self._int32_tensors(starts, seq_lens, table)
        return AttentionMetadata(
            num_actual_tokens=num_tokens,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens_tensor,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            block_table=flat_table.view(len(blocks), width),
            max_query_len=max(queries, default=0),
            max_seq_len=max(seq_lens, default=0),
            num_prefills=len(queries) - num_decodes,
            num_prefill_tokens=num_tokens - num_decodes,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
        )

    def from_buffers(
        self,
        step: MetadataBuffers[torch.Tensor],
        *,
        num_reqs: int,
        num_tokens: int,
        num_decodes: int,
        max_query_len: int,
        max_seq_len: int,
    ) -> AttentionMetadata:
        """Metadata of a step whose ``num_reqs`` requests (decodes first) and
        ``num_tokens`` tokens the caller wrote into ``step``: views of its buffers, as
        long as the step (``query_start_loc`` ``num_reqs + 1``, ``slot_mapping``
        ``num_tokens``, the others ``num_reqs``), the block table at its fixed width."""
        return AttentionMetadata(
            num_actual_tokens=num_tokens,
            query_start_loc=step.query_start_loc,
            seq_lens=step.seq_lens,
            slot_mapping=step.slot_mapping,
            block_table=step.block_table,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            num_prefills=num_reqs - num_decodes,
            num_prefill_tokens=num_tokens - num_decodes,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
        )

    def _check(self, queries: list[int], contexts: list[int], blocks: list[list[int]]) -> None:
        seen_prefill = False
        for r, (query_len, context_len, row) in enumerate(
            zip(queries, contexts, blocks, strict=True)
        ):
            if query_len < 1 or context_len < 0:
                raise ValueError(
                    f"request {r}: query_len {query_len} must be >= 1 and "
                    f"context_len {context_len} >= 0"
                )
            if query_len == 1 and seen_prefill:
                raise ValueError(
                    f"request {r} decodes (query_len 1) after a prefill; order the batch "
                    "[decodes..., prefills...] so backends can split it without gathering"
                )
            seen_prefill = seen_prefill or query_len > 1
            needed = num_blocks_for(context_len + query_len, self.block_size)
            if len(row) < needed:
                raise ValueError(
                    f"request {r} holds {context_len + query_len} tokens, which need "
                    f"{needed} blocks of {self.block_size}, but has {len(row)} block ids"
                )

    def _int32_tensors(self, *parts: list[int]) -> list[torch.Tensor]:
        """``parts`` as int32 tensors made by one host-to-device copy: views of one
        tensor, each starting on a 16-byte boundary, as kernels read aligned pointers
        fastest (and Triton specialises on the alignment)."""
        flat: list[int] = []
        starts = []
        for part in parts:
            starts.append(len(flat))
            flat += part
            flat += [0] * (-len(flat) % _INT32_PER_16_BYTES)
        packed = torch.tensor(flat, dtype=torch.int32, device=self.device)
        return [
            packed[start : start + len(part)] for start, part in zip(starts, parts, strict=True)
        ]


_INT32_PER_16_BYTES = 4


def _ints(values: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(values, torch.Tensor):
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]
