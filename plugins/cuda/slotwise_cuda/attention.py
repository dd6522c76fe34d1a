"""``TRITON_PAGED``: paged attention with the Triton kernels of ``slotwise_cuda.kernels``.

A mixed batch is ``[decodes..., prefills...]``, so the head goes to the decode
kernel (one query token per sequence) and the tail to the prefill kernel, each on
a slice of the same tensors: nothing is gathered or reordered.  The kernels module (and
Triton) is imported on the first forward, not when the backend is selected.
"""

from __future__ import annotations

import torch

from slotwise.plugin_api import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    GraphSupport,
    write_to_kv_cache,
)


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
        from slotwise_cuda.kernels.attention import paged_decode_attention, paged_prefill_attention

        num_tokens = metadata.num_actual_tokens
        write_to_kv_cache(k[:num_tokens], v[:num_tokens], kv_cache, metadata.slot_mapping)
        key_cache, value_cache = kv_cache.unbind(0)
        if q.stride(-1) != 1:  # the kernels take strided rows and heads, not strided values
            q = q.contiguous()
        decodes = metadata.num_decodes  # one token each: rows 0..decodes-1
        if decodes:
            paged_decode_attention(
                q[:decodes],
                key_cache,
                value_cache,
                metadata.block_table[:decodes],
                metadata.seq_lens[:decodes],
                self.scale,
                output[:decodes],
            )
        if metadata.num_prefills:
            paged_prefill_attention(
                q[decodes:num_tokens],
                key_cache,
                value_cache,
                metadata.block_table[decodes:],
                metadata.query_start_loc[decodes:] - decodes,
                metadata.seq_lens[decodes:],
                self.scale,
                output[decodes:num_tokens],
            )
