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

The tensors are allocated here, or are a runner's own step buffers
(``MetadataBuffers``): then the runner writes the real requests into host arrays,
these methods add the padding rows there (``pad_uniform_decode``, ``pad_general``),
and one copy to the device fills the tensors a replay reads, with nothing copied twice.
"""

from __future__ import annotations

from typing import Any

import torch

from slotwise.attention.metadata import AttentionMetadata, MetadataBuffers


class StaticAttentionMetadata:
    """Metadata buffers for up to ``max_tokens`` tokens (= requests, at least one token each).

    ``buffers``: tensors to use instead of allocating (at least ``max_tokens`` requests
    and tokens, ``max_blocks_per_request`` blocks wide), e.g. views of a runner's step
    buffers.
    """

    def __init__(
        self,
        max_tokens: int,
        max_blocks_per_request: int,
        block_size: int,
        scratch_block: int,
        device: torch.device | str,
        *,
        buffers: MetadataBuffers[torch.Tensor] | None = None,
    ) -> None:
        self.max_tokens = max_tokens
        self.max_blocks_per_request = max_blocks_per_request
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        #: Host-side bound reported as ``max_seq_len``: a backend reading it sizes
        #: its work for any sequence the cache can hold, not the captured step's.
        self.max_seq_len = max_blocks_per_request * block_size
        self._positions = torch.arange(max_tokens + 1, dtype=torch.int32, device=device)
        if buffers is None:
            buffers = MetadataBuffers(
                query_start_loc=self._positions.clone(),
                seq_lens=torch.ones(max_tokens, dtype=torch.int32, device=device),
                slot_mapping=torch.full(
                    (max_tokens,), self.scratch_slot, dtype=torch.int64, device=device
                ),
                block_table=torch.full(
                    (max_tokens, max_blocks_per_request),
                    scratch_block,
                    dtype=torch.int32,
                    device=device,
                ),
            )
        elif (
            buffers.seq_lens.shape[0] < max_tokens
            or buffers.slot_mapping.shape[0] < max_tokens
            or tuple(buffers.block_table.shape[1:]) != (max_blocks_per_request,)
        ):
            raise ValueError(
                f"static metadata buffers of {buffers.seq_lens.shape[0]} requests, "
                f"{buffers.slot_mapping.shape[0]} tokens and block table "
                f"{tuple(buffers.block_table.shape)} do not hold {max_tokens} tokens of "
                f"{max_blocks_per_request} blocks; allocate them at least that large"
            )
        self.buffers = buffers
        self.query_start_loc = buffers.query_start_loc
        self.seq_lens = buffers.seq_lens
        self.slot_mapping = buffers.slot_mapping
        self.block_table = buffers.block_table
        self._views: dict[int, MetadataBuffers[torch.Tensor]] = {}
        #: One metadata object per size and layout (padded size, decodes), handed out
        #: again for every step of that layout: its tensors are these buffers.
        self._metadata: dict[tuple[int, int], AttentionMetadata] = {}

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
        num_reqs, num_tokens = self._copy(padded_size, metadata)
        self._pad(self.buffers, self._positions, padded_size, num_reqs, num_tokens)
        return self.uniform_decode_view(padded_size)

    def general(self, padded_size: int, metadata: AttentionMetadata | None) -> AttentionMetadata:
        """Any batch padded to ``padded_size`` requests, all counted as prefills (the
        split between decodes and prefills changes from step to step; a graph cannot),
        for backends with ``GraphSupport.ALWAYS``."""
        num_reqs, num_tokens = self._copy(padded_size, metadata)
        self._pad(self.buffers, self._positions, padded_size, num_reqs, num_tokens)
        return self.general_view(padded_size)

    def pad_uniform_decode(
        self, padded_size: int, num_reqs: int, host: MetadataBuffers[Any], arange: Any
    ) -> AttentionMetadata:
        """``uniform_decode`` for a caller that wrote its ``num_reqs`` decodes into
        ``host`` (arrays laid out as these buffers, copied into them before the step
        runs) itself: the padding goes there too; ``arange``: 0, 1, ... of the
        arrays' kind, at least ``padded_size + 1`` long."""
        self._check_size(padded_size)
        if num_reqs < padded_size:
            self._pad(host, arange, padded_size, num_reqs, num_reqs)
        return self.uniform_decode_view(padded_size)

    def pad_general(
        self,
        padded_size: int,
        num_reqs: int,
        num_tokens: int,
        host: MetadataBuffers[Any],
        arange: Any,
    ) -> AttentionMetadata:
        """``general`` for a caller that wrote its requests into ``host`` itself (see
        ``pad_uniform_decode``)."""
        self._check_size(padded_size)
        if num_tokens > padded_size:
            raise ValueError(
                f"a step of {num_tokens} tokens does not fit static metadata padded to "
                f"{padded_size} tokens"
            )
        self._pad(host, arange, padded_size, num_reqs, num_tokens)
        return self.general_view(padded_size)

    def uniform_decode_view(self, padded_size: int) -> AttentionMetadata:
        """The buffers as ``padded_size`` one-token decodes, as they are now."""
        return self._view(padded_size, max_query_len=1, num_decodes=padded_size, num_prefills=0)

    def general_view(self, padded_size: int) -> AttentionMetadata:
        """The buffers as ``padded_size`` requests of any length, as they are now."""
        return self._view(
            padded_size, max_query_len=padded_size, num_decodes=0, num_prefills=padded_size
        )

    def _check_size(self, padded_size: int) -> None:
        if padded_size > self.max_tokens:
            raise ValueError(
                f"size {padded_size} exceeds the static metadata's {self.max_tokens} tokens; "
                "sizes above the largest capture size run without graphs"
            )

    def _copy(self, padded_size: int, metadata: AttentionMetadata | None) -> tuple[int, int]:
        """Copy ``metadata``'s requests into the buffers; their requests and tokens."""
        self._check_size(padded_size)
        if metadata is None:
            return 0, 0
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
        return num_reqs, num_tokens

    def _pad(
        self,
        arrays: MetadataBuffers[Any],
        arange: Any,
        padded_size: int,
        num_reqs: int,
        num_tokens: int,
    ) -> None:
        """Padding requests after the ``num_reqs`` real ones (``num_tokens`` tokens) in
        ``arrays``: tensors or host arrays, written only by slicing, as both allow."""
        padding = padded_size - num_tokens
        if padding:  # one request per padding token
            stop = num_reqs + padding
            arrays.query_start_loc[num_reqs + 1 : stop + 1] = arange[
                num_tokens + 1 : padded_size + 1
            ]
            arrays.seq_lens[num_reqs:stop] = 1
            arrays.block_table[num_reqs:stop, 0] = self.scratch_block
            arrays.slot_mapping[num_tokens:padded_size] = self.scratch_slot
        if num_reqs + padding < padded_size:  # request slots left over: no tokens
            arrays.query_start_loc[num_reqs + padding + 1 : padded_size + 1] = padded_size
            arrays.seq_lens[num_reqs + padding : padded_size] = 0

    def _view(
        self, padded_size: int, *, max_query_len: int, num_decodes: int, num_prefills: int
    ) -> AttentionMetadata:
        key = (padded_size, num_decodes)
        metadata = self._metadata.get(key)
        if metadata is not None:
            # The same tensors with new contents and the same counts (next_step would
            # set them as they are): what its layout_cache holds still holds.
            metadata.step_cache.clear()
            return metadata
        views = self._views.get(padded_size)
        if views is None:  # made once per size: the addresses never change
            views = self._views[padded_size] = MetadataBuffers(
                query_start_loc=self.query_start_loc[: padded_size + 1],
                seq_lens=self.seq_lens[:padded_size],
                slot_mapping=self.slot_mapping[:padded_size],
                block_table=self.block_table[:padded_size],
            )
        metadata = self._metadata[key] = AttentionMetadata(
            num_actual_tokens=padded_size,
            query_start_loc=views.query_start_loc,
            seq_lens=views.seq_lens,
            slot_mapping=views.slot_mapping,
            block_table=views.block_table,
            max_query_len=max_query_len,
            max_seq_len=self.max_seq_len,
            num_prefills=num_prefills,
            num_prefill_tokens=padded_size if num_prefills else 0,
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
        )
        return metadata
