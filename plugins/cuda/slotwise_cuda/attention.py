"""``TRITON_PAGED``: paged attention with the Triton kernels of ``slotwise_cuda.kernels``.

A mixed batch is ``[decodes..., prefills...]``, so the head goes to the decode
kernel (one query token per sequence) and the tail to the prefill kernel, each on
a slice of the same tensors: nothing is gathered or reordered.  The kernels module (and
Triton) is imported on the first forward, not when the backend is selected.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from slotwise.plugin_api import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    GraphSupport,
    write_to_kv_cache,
)

if TYPE_CHECKING:
    from slotwise.plugin_api import BatchSplit


class TritonPagedBackend(AttentionBackend):
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    # The kernels pad the head size to a power of two; these are the sizes checked
    # against the reference implementation.
    supported_head_sizes = (32, 64, 80, 96, 112, 128, 256)
    # Neither kernel reads the device on the host, and the prefill kernel's grid
    # depends on tensor shapes alone, so the launches can be captured.  The
    # decode/prefill split is a host value baked into a graph: full graphs of mixed
    # batches get StaticAttentionMetadata.general, where every request is a "prefill"
    # (requests of query length 0 included) and the prefill kernel runs them all.
    graph_support = GraphSupport.ALWAYS

    @classmethod
    def get_name(cls) -> str:
        return "TRITON_PAGED"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return TritonPagedImpl


class TritonPagedImpl(AttentionImpl):
    """Per layer and step: one copy into the cache, one launch per part of the batch.

    What is the same for every layer of a step is worked out by the first layer only:
    the decode/prefill views (``metadata.split``) and the checked, configured launches
    (in ``metadata.step_cache``, keyed by the layout of the layer's tensors, so a layer
    laid out differently gets its own checks).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (kv_cache, its address, its key half, its value half): unbound once per cache.
        self._halves: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None

    def forward(
        self,
        layer: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        write_to_kv_cache(k, v, kv_cache, metadata.slot_mapping)
        key_cache, value_cache = self._cache_halves(kv_cache)
        if q.stride(-1) != 1:  # the kernels take strided rows and heads, not strided values
            q = q.contiguous()
        split = metadata.split
        decodes = metadata.num_decodes  # one token each: rows 0..decodes-1
        if decodes:
            rows_q, rows_out = _rows(q, 0, decodes), _rows(output, 0, decodes)
            launch = _bound(metadata, rows_q, kv_cache, rows_out, split, decode=True)
            launch(
                rows_q,
                key_cache,
                value_cache,
                split.decode_block_table,
                split.decode_seq_lens,
                rows_out,
                self.scale,
            )
        if metadata.num_prefills:
            num_tokens = metadata.num_actual_tokens
            rows_q, rows_out = _rows(q, decodes, num_tokens), _rows(output, decodes, num_tokens)
            launch = _bound(metadata, rows_q, kv_cache, rows_out, split, decode=False)
            launch(
                rows_q,
                key_cache,
                value_cache,
                split.prefill_block_table,
                split.prefill_seq_lens,
                rows_out,
                self.scale,
                split.prefill_query_start_loc,
            )

    def _cache_halves(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        halves = self._halves
        if halves is None or halves[0] is not kv_cache or halves[1] != kv_cache.data_ptr():
            halves = self._halves = (kv_cache, kv_cache.data_ptr(), *kv_cache.unbind(0))
        return halves[2], halves[3]


def _rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop``; the tensor itself when that is all of it (a slice costs a
    microsecond or two, paid per layer and step)."""
    return tensor if start == 0 and stop == tensor.shape[0] else tensor[start:stop]


def _bound(
    metadata: AttentionMetadata,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    split: BatchSplit,
    *,
    decode: bool,
) -> Any:
    """The step's checked launch for tensors laid out as these, bound on first use."""
    key = (
        decode,
        q.shape,
        q.stride(),
        q.dtype,
        q.device,
        out.shape,
        out.stride(),
        out.dtype,
        out.device,
        kv_cache.shape,
        kv_cache.stride(),
        kv_cache.dtype,
        kv_cache.device,
    )
    launch = metadata.step_cache.get(key)
    if launch is None:
        key_cache, value_cache = kv_cache.unbind(0)
        kernels = _kernels()
        if decode:
            launch = kernels.PagedAttentionLaunch(
                q, key_cache, value_cache, split.decode_block_table, split.decode_seq_lens, out
            )
        else:
            launch = kernels.PagedAttentionLaunch(
                q,
                key_cache,
                value_cache,
                split.prefill_block_table,
                split.prefill_seq_lens,
                out,
                split.prefill_query_start_loc,
            )
        metadata.step_cache[key] = launch
    return launch


@functools.cache
def _kernels() -> ModuleType:
    """The kernels module, imported (with Triton) on the first forward."""
    from slotwise_cuda.kernels import attention

    return attention
