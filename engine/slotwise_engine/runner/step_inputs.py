"""Persistent step inputs: the buffers a runner's steps are written into, kept across steps.

Every step the model reads token ids, positions and attention metadata (query starts,
sequence lengths, slot mapping, block table).  Rather than making those tensors from
Python lists each step, the runner keeps host buffers for them, writes each step's
values through numpy views and sends them to the device in one copy per storage (two:
token ids and metadata share one storage, positions have their own, as the model's
two inputs must each start a storage: Dynamo guards a view's storage offset, and a
trace with such a guard cannot be saved for a warm start).  On the CPU the device
buffers are the host buffers: nothing is copied.

The block table is as wide as the most blocks one request may hold, whatever the step,
so no kernel ever sees it change shape as requests decode; a row is rewritten only
when another request takes it or its request's blocks grow.  A request joins the batch
the first step it is in, grows as its block list grows (blocks are appended, never
replaced) and leaves when a step goes on without it (its row goes to the next request)
or it is freed (``forget``).

Steps of up to the largest capture size use buffers sized for it, allocated once: the
static-graph inputs and the static attention metadata are views of those device
buffers, so a replay reads them in place.  Larger steps, which run without graphs,
use a second set that grows as needed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np
import torch

from slotwise.attention.cache_allocation import kv_cache_allocations
from slotwise.attention.metadata import AttentionMetadata, MetadataBuffers

logger = logging.getLogger(__name__)

_ALIGN = 16  # bytes: kernels read aligned pointers fastest, Triton specialises on it
#: Views kept per step shape before the cache starts over (mixed batches vary).
_MAX_CACHED_VIEWS = 512


class StepRequest(Protocol):
    """What the buffers read of a request (``ModelRunner``'s ``Request``)."""

    tokens: list[int]
    block_ids: list[int]
    num_cached: int


class StepBuffers:
    """Host and device buffers for steps of up to ``max_tokens`` tokens and as many
    requests, with a block table ``width`` blocks wide.

    One storage holds the token ids (first, at offset 0), the slot mapping, the query
    starts, the sequence lengths and the block table, each on a 16-byte boundary;
    positions have a storage of their own.  ``upload`` copies what a step wrote.
    """

    def __init__(
        self,
        max_tokens: int,
        width: int,
        device: torch.device,
        *,
        pin_memory: bool,
    ) -> None:
        self.max_tokens = max_tokens
        self.width = width
        self.device = device
        reqs = max_tokens  # every request has at least one token in a step
        sizes = {
            "input_ids": max_tokens * 8,
            "slot_mapping": max_tokens * 8,
            "query_start_loc": (reqs + 1) * 4,
            "seq_lens": reqs * 4,
            "block_table": reqs * width * 4,
        }
        offsets, end = {}, 0
        for name, size in sizes.items():
            offsets[name] = end
            end += -(-size // _ALIGN) * _ALIGN
        self._block_table_offset = offsets["block_table"]
        self._row_bytes = width * 4
        self.host_packed = torch.zeros(end, dtype=torch.uint8, pin_memory=pin_memory)
        self.host_positions = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=pin_memory)
        if device.type == "cpu":
            self.device_packed, self.device_positions = self.host_packed, self.host_positions
        else:
            self.device_packed = torch.zeros(end, dtype=torch.uint8, device=device)
            self.device_positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self._non_blocking = pin_memory
        #: Recorded after each upload when it does not block: the host buffers are
        #: written again only once the device has read them.
        self._uploaded = torch.Event(device=device) if pin_memory else None

        def typed(packed: torch.Tensor, name: str, dtype: torch.dtype) -> torch.Tensor:
            return packed[offsets[name] : offsets[name] + sizes[name]].view(dtype)

        def metadata(packed: torch.Tensor) -> MetadataBuffers[torch.Tensor]:
            return MetadataBuffers(
                query_start_loc=typed(packed, "query_start_loc", torch.int32),
                seq_lens=typed(packed, "seq_lens", torch.int32),
                slot_mapping=typed(packed, "slot_mapping", torch.int64),
                block_table=typed(packed, "block_table", torch.int32).view(reqs, width),
            )

        #: What the model and the attention read: views of the device storages.
        self.input_ids = typed(self.device_packed, "input_ids", torch.int64)
        self.positions = self.device_positions
        self.metadata = metadata(self.device_packed)
        #: What a step writes: numpy views of the host storages.
        host = metadata(self.host_packed)
        self.host_metadata: MetadataBuffers[np.ndarray] = MetadataBuffers(
            query_start_loc=host.query_start_loc.numpy(),
            seq_lens=host.seq_lens.numpy(),
            slot_mapping=host.slot_mapping.numpy(),
            block_table=host.block_table.numpy(),
        )
        self.host_input_ids = typed(self.host_packed, "input_ids", torch.int64).numpy()
        self.host_positions_np = self.host_positions.numpy()
        #: The request whose blocks each block-table row holds (None: none), and how many.
        self.rows: list[StepRequest | None] = [None] * reqs
        self.row_blocks = [0] * reqs
        #: The first query starts are 0, 1, ... this far (a decode step's layout).
        self.decode_starts = 0
        self._views: dict[tuple[int, int], MetadataBuffers[torch.Tensor]] = {}
        self._inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: Step shape -> the metadata of the last step of that shape over these buffers.
        self._metadata: dict[tuple[int, int, int], AttentionMetadata] = {}
        self._kv_cache_allocations = kv_cache_allocations()

    def metadata_views(self, num_reqs: int, num_tokens: int) -> MetadataBuffers[torch.Tensor]:
        """The device metadata of a step of ``num_reqs`` requests and ``num_tokens``
        tokens: views made once per shape, as a step's shapes repeat (decodes)."""
        views = self._views.get((num_reqs, num_tokens))
        if views is None:
            if len(self._views) >= _MAX_CACHED_VIEWS:
                self._views.clear()
            meta = self.metadata
            views = self._views[num_reqs, num_tokens] = MetadataBuffers(
                query_start_loc=meta.query_start_loc[: num_reqs + 1],
                seq_lens=meta.seq_lens[:num_reqs],
                slot_mapping=meta.slot_mapping[:num_tokens],
                block_table=meta.block_table[:num_reqs],
            )
        return views

    def step_metadata(self, shape: tuple[int, int, int]) -> AttentionMetadata | None:
        """The metadata kept for steps of ``shape`` (requests, tokens, decodes), to serve
        the next one (``slotwise.attention.metadata.next_step``): its tensors are views of these
        buffers, rewritten in place, so what backends keep in its ``layout_cache``
        (bound launches, per-layer plans) holds.  None when none is kept; all are dropped
        once KV caches were allocated again, so none keeps an old cache alive."""
        if self._kv_cache_allocations != kv_cache_allocations():
            self._kv_cache_allocations = kv_cache_allocations()
            self._metadata.clear()
            return None
        return self._metadata.get(shape)

    def keep_step_metadata(self, shape: tuple[int, int, int], metadata: AttentionMetadata) -> None:
        """Keep ``metadata``, made over these buffers, for the next step of ``shape``."""
        if len(self._metadata) >= _MAX_CACHED_VIEWS:
            self._metadata.clear()
        self._metadata[shape] = metadata

    def model_inputs(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The device token ids and positions of a step of ``num_tokens`` (padded) tokens."""
        inputs = self._inputs.get(num_tokens)
        if inputs is None:
            if len(self._inputs) >= _MAX_CACHED_VIEWS:
                self._inputs.clear()
            inputs = self._inputs[num_tokens] = (
                self.input_ids[:num_tokens],
                self.positions[:num_tokens],
            )
        return inputs

    def wait_for_upload(self) -> None:
        """Block until the device has read the last upload (no-op where uploads block)."""
        if self._uploaded is not None:
            self._uploaded.synchronize()

    def upload(self, num_tokens: int, num_rows: int) -> None:
        """Copy the first ``num_tokens`` positions and everything up to block-table row
        ``num_rows`` to the device (nothing on the CPU, where they are the same)."""
        if self.device_packed is self.host_packed:
            return
        end = self._block_table_offset + num_rows * self._row_bytes
        blocking = not self._non_blocking
        self.device_positions[:num_tokens].copy_(
            self.host_positions[:num_tokens], non_blocking=not blocking
        )
        self.device_packed[:end].copy_(self.host_packed[:end], non_blocking=not blocking)
        if self._uploaded is not None:
            self._uploaded.record()

    def forget_rows(self, rows: Iterable[int]) -> None:
        """Block-table rows that no longer hold their request's blocks."""
        for row in rows:
            self.rows[row] = None

    def forget_contents(self) -> None:
        """The device buffers were written around the host arrays (on the CPU: the host
        arrays themselves): nothing written before can be relied on."""
        self.forget_rows(range(len(self.rows)))
        self.decode_starts = 0


class StepInputs:
    """The runner's persistent step inputs (see the module docstring).

    ``graph_tokens``: the largest capture size (0 without graphs); ``width``: the most
    blocks one request may hold; ``max_model_len``: the most tokens one request may hold.
    """

    def __init__(
        self,
        graph_tokens: int,
        width: int,
        block_size: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        self.width = width
        self.block_size = block_size
        self.device = device
        self.pin_memory = _can_pin(device)
        #: Steps of up to the largest capture size: fixed addresses, read by graphs.
        self.graph = (
            StepBuffers(graph_tokens, width, device, pin_memory=self.pin_memory)
            if graph_tokens
            else None
        )
        #: Larger steps: grown as needed, never read by a graph.
        self.large: StepBuffers | None = None
        #: 0, 1, ...: positions and query starts are slices of it.
        self._arange = np.arange(max(graph_tokens, max_model_len) + 1, dtype=np.int64)

    def buffers_for(self, num_tokens: int) -> StepBuffers:
        """The buffers a step of ``num_tokens`` (padded) tokens is written into."""
        if self.graph is not None and num_tokens <= self.graph.max_tokens:
            return self.graph
        if self.large is None or self.large.max_tokens < num_tokens:
            size = max(1 << (num_tokens - 1).bit_length(), 2 * self._graph_tokens())
            self.large = StepBuffers(size, self.width, self.device, pin_memory=self.pin_memory)
            if self._arange.shape[0] <= size:
                self._arange = np.arange(size + 1, dtype=np.int64)
        return self.large

    @property
    def arange(self) -> np.ndarray:
        """0, 1, ...: at least as long as any step's tokens and any request's, plus one."""
        return self._arange

    def pad_inputs(self, buffers: StepBuffers, num_tokens: int, padded_size: int) -> None:
        """Zero the token ids and positions of a step's padding rows: they are computed
        and sliced away, but a step-wide reduction over them (dynamic rope scaling takes
        the step's largest position) must not see what an earlier, larger step left."""
        buffers.host_input_ids[num_tokens:padded_size] = 0
        buffers.host_positions_np[num_tokens:padded_size] = 0

    def write(
        self,
        buffers: StepBuffers,
        batch: Sequence[StepRequest],
        query_lens: Sequence[int],
        *,
        uniform_decode: bool,
    ) -> None:
        """Write a step of ``batch`` (decodes first) with ``query_lens`` new tokens each
        into ``buffers``' host arrays: token ids, positions, query starts, sequence
        lengths, slot mapping, and the block-table rows that changed."""
        buffers.wait_for_upload()
        self._write_block_tables(buffers, batch)
        meta = buffers.host_metadata
        ids, positions = buffers.host_input_ids, buffers.host_positions_np
        size = self.block_size
        n = len(batch)
        if uniform_decode:
            # Element by element: cheaper than a slice assigned from a list at the
            # batch sizes decodes run at.
            seq_lens, slot_mapping = meta.seq_lens, meta.slot_mapping
            for row, request in enumerate(batch):
                pos = request.num_cached
                ids[row] = request.tokens[-1]
                positions[row] = pos
                seq_lens[row] = pos + 1
                slot_mapping[row] = request.block_ids[pos // size] * size + pos % size
            if buffers.decode_starts <= n:
                meta.query_start_loc[: n + 1] = self._arange[: n + 1]
                buffers.decode_starts = n + 1
            return
        start = 0
        table = meta.block_table
        meta.query_start_loc[0] = 0
        buffers.decode_starts = 0
        for row, (request, query_len) in enumerate(zip(batch, query_lens, strict=True)):
            first, end = request.num_cached, len(request.tokens)
            stop = start + query_len
            ids[start:stop] = request.tokens[first:]
            step_positions = self._arange[first:end]
            positions[start:stop] = step_positions
            meta.slot_mapping[start:stop] = table[row, step_positions // size] * size + (
                step_positions % size
            )
            meta.seq_lens[row] = end
            meta.query_start_loc[row + 1] = stop
            start = stop

    def _write_block_tables(self, buffers: StepBuffers, batch: Sequence[StepRequest]) -> None:
        rows, row_blocks, table = (
            buffers.rows,
            buffers.row_blocks,
            buffers.host_metadata.block_table,
        )
        for row, request in enumerate(batch):
            blocks = request.block_ids
            if rows[row] is request and row_blocks[row] == len(blocks):
                continue
            if len(blocks) > self.width:
                raise ValueError(
                    f"a request holds {len(blocks)} cache blocks, more than the {self.width} "
                    "of the longest request the runner takes (max_model_len); raise "
                    "max_model_len or give it fewer blocks"
                )
            table[row, : len(blocks)] = blocks
            table[row, len(blocks) :] = 0
            rows[row], row_blocks[row] = request, len(blocks)

    def forget(self, requests: Iterable[StepRequest]) -> None:
        """``requests`` have left: no row holds their blocks any more."""
        gone = {id(request) for request in requests}
        for buffers in (self.graph, self.large):
            if buffers is not None:
                buffers.forget_rows(
                    row for row, held in enumerate(buffers.rows) if id(held) in gone
                )

    def _graph_tokens(self) -> int:
        return 0 if self.graph is None else self.graph.max_tokens


def _can_pin(device: torch.device) -> bool:
    """Whether host buffers for ``device`` can be page-locked, so that copies to it need
    not block: only for an accelerator torch drives, asked through ``torch.accelerator``
    (which loads no vendor library where there is none)."""
    if device.type == "cpu" or not torch.accelerator.is_available():
        return False
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != device.type:
        return False
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError as exc:
        logger.warning(
            "host buffers of the step inputs are not page-locked (%s): copies to %s block",
            exc,
            device,
        )
        return False
    return True
