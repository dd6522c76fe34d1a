"""Attention metadata at fixed addresses, for steps replayed as one FULL static graph.

A FULL graph captures the attention kernels too, and with them the addresses of the
metadata tensors and every host-side value the backend read at capture (token and
request counts).  So FULL steps take their metadata from here: tensors allocated
once for the largest capture size and refilled in place every step, and counts that
depend only on the padded size.

The padded batch keeps its real requests first.  Each padding token becomes a request
of its own that decodes one token on a scratch cache block no real request owns, so
every row the graph computes is finite; request slots left over after that are
empty (query length 0, sequence length 0).  In a uniform-decode batch there are none.
"""

from __future__ import annotations

import torch

from slotwise.attention.metadata import AttentionMetadata


class StaticAttentionMetadata:
    """Metadata buffers for up to ``max_tokens`` tokens (= requests, at least one token each)."""

    def __init__(
        self,
        max_tokens: int,
        max_blocks_per_request: int,
        block_size: int,
        scratch_block: int,
        device: torch.device | str,
    ) -> None:
        self.max_tokens = max_tokens
        self.max_blocks_per_request = max_blocks_per_request
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        #: Host-side bound reported as ``max_seq_len``: a backend reading it sizes
        #: its work for any sequence the cache can hold, not the captured step's.
        self.max_seq_len = max_blocks_per_request * block_size
        self._positions = torch.arange(max_tokens + 1, dtype=torch.int32, device=device)
        self.query_start_loc = self._positions.clone()
        self.seq_lens = torch.ones(max_tokens, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full(
            (max_tokens,), self.scratch_slot, dtype=torch.int64, device=device
        )
        self.block_table = torch.full(
            (max_tokens, max_blocks_per_request), scratch_block, dtype=torch.int32, device=device
        )

    def uniform_decode(
        self, padded_size: int, metadata: AttentionMetadata | None
    ) -> AttentionMetadata:
        """``metadata`` (one new token per request; None: no real request) padded to
        ``padded_size`` decodes, for backends with ``GraphSupport.UNIFORM_DECODE``."""
        if metadata is not None and metadata.num_prefills:
            raise ValueError(
                f"a uniform-decode step has {metadata.num_prefills} request(s) with more than "
                "one new token; pass uniform_decode=False for batches with prefills"
            )
        self._fill(padded_size, metadata)
        return self._view(padded_size, max_query_len=1, num_decodes=padded_size, num_prefills=0)

    def general(self, padded_size: int, metadata: AttentionMetadata | None) -> AttentionMetadata:
        """Any batch padded to ``padded_size`` requests, all counted as prefills (the
        split between decodes and prefills changes from step to step; a graph cannot),
        for backends with ``GraphSupport.ALWAYS``."""
        self._fill(padded_size, metadata)
        return self._view(
            padded_size, max_query_len=padded_size, num_decodes=0, num_prefills=padded_size
        )

    def _fill(self, padded_size: int, metadata: AttentionMetadata | None) -> None:
        if padded_size > self.max_tokens:
            raise ValueError(
                f"size {padded_size} exceeds the static metadata's {self.max_tokens} tokens; "
                "sizes above the largest capture size run without graphs"
            )
        num_reqs = num_tokens = 0
        if metadata is not None:
            num_reqs, num_tokens = metadata.num_reqs, metadata.num_actual_tokens
            width = metadata.block_table.shape[1]
            if num_tokens > padded_size or width > self.max_blocks_per_request:
                raise ValueError(
                    f"a step of {num_tokens} tokens and {width} blocks per request does not "
                    f"fit static metadata padded to {padded_size} tokens of at most "
                    f"{self.max_blocks_per_request} blocks"
                )
            self.query_start_loc[: num_reqs + 1].copy_(metadata.query_start_loc)
            self.seq_lens[:num_reqs].copy_(metadata.seq_lens)
            self.slot_mapping[:num_tokens].copy_(metadata.slot_mapping)
            self.block_table[:num_reqs, :width].copy_(metadata.block_table)
        padding = padded_size - num_tokens
        pads = slice(num_reqs, num_reqs + padding)  # one request per padding token
        self.query_start_loc[pads.start + 1 : pads.stop + 1].copy_(
            self._positions[num_tokens + 1 : padded_size + 1]
        )
        self.seq_lens[pads].fill_(1)
        self.block_table[pads, 0].fill_(self.scratch_block)
        self.slot_mapping[num_tokens:padded_size].fill_(self.scratch_slot)
        empty = slice(pads.stop, padded_size)  # request slots left over: no tokens
        self.query_start_loc[empty.start + 1 : empty.stop + 1].fill_(padded_size)
        self.seq_lens[empty].fill_(0)

    def _view(
        self, padded_size: int, *, max_query_len: int, num_decodes: int, num_prefills: int
    ) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=padded_size,
            query_start_loc=self.query_start_loc[: padded_size + 1],
            seq_lens=self.seq_lens[:padded_size],
            slot_mapping=self.slot_mapping[:padded_size],
            block_table=self.block_table[:padded_size],
            max_query_len=max_query_len,
            max_seq_len=self.max_seq_len,
            num_prefills=num_prefills,
            num_prefill_tokens=padded_size if num_prefills else 0,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
        )
