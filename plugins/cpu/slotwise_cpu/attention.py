"""``CPU_SDPA``: paged attention on the CPU with torch's scaled_dot_product_attention.

Decodes read the paged cache in place with the plugin's C kernel
(``slotwise_cpu.paged_decode``), so their cost follows the tokens each request holds.
Where that kernel cannot be built (no C compiler; a warning says so), their keys and
values are gathered into dense tensors and run as one batched SDPA call with a padding
mask.  Each prefill gathers its blocks and runs SDPA on its own, causal over its
context and new tokens (its cost is the arithmetic, not the copy).  Grouped-query
attention uses SDPA's ``enable_gqa``.

The cache is head-major within each block, ``[2, num_blocks, num_kv_heads, block_size,
head_size]``: the kernel reads one head's rows of a block at a time, and there they lie
together, so it reads memory front to back (1.2x to 1.3x faster per layer at 16 x 2,048
tokens on an AVX2 host than the core's token-major layout; see docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slotwise.plugin_api import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    GraphSupport,
)
from slotwise_cpu import paged_decode
from slotwise_cpu.paged_decode import paged_decode_op


class CpuSdpaBackend(AttentionBackend):
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    graph_support = GraphSupport.PIECEWISE_ONLY  # the CPU has no static graphs anyway

    @classmethod
    def get_name(cls) -> str:
        return "CPU_SDPA"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return CpuSdpaImpl

    @classmethod
    def get_kv_cache_shape(
        cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """Head-major blocks (see the module's docstring)."""
        return (2, num_blocks, num_kv_heads, block_size, head_size)


class CpuSdpaImpl(AttentionImpl):
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
        num_tokens = metadata.num_actual_tokens
        num_decodes = metadata.num_decodes
        kernel = paged_decode.supports(q, kv_cache) and paged_decode.available()
        if kernel and num_decodes == num_tokens:
            # Only decodes: the kernel stores the new keys and values itself.
            paged_decode_op(
                _rows(q, num_decodes),
                kv_cache,
                metadata.block_table,
                metadata.seq_lens,
                _rows(output, num_decodes),
                self.scale,
                _rows(k, num_tokens),
                _rows(v, num_tokens),
                metadata.slot_mapping,
            )
            return
        plan = _step_plan(metadata, kv_cache.shape[1], kv_cache.shape[3])
        _write(k[:num_tokens], v[:num_tokens], kv_cache, plan)
        key_cache, value_cache = kv_cache.unbind(0)
        split = metadata.split  # sliced once per step, for every layer
        if num_decodes and kernel:
            paged_decode_op(
                q[:num_decodes],
                kv_cache,
                split.decode_block_table,
                split.decode_seq_lens,
                output[:num_decodes],
                self.scale,
            )
        elif num_decodes:
            output[:num_decodes] = self._decode(
                q[:num_decodes],
                key_cache,
                value_cache,
                split.decode_block_table,
                split.decode_seq_lens,
            )
        for r in range(num_decodes, metadata.num_reqs):
            start, end = plan.starts[r], plan.starts[r + 1]
            output[start:end] = self._prefill(
                q[start:end], key_cache, value_cache, metadata.block_table[r], plan.seq_lens[r]
            )

    def _decode(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One query token per request: pad every sequence to the longest and mask."""
        block_size = key_cache.shape[2]
        width = -(-int(seq_lens.max()) // block_size)
        blocks = block_table[:, :width]
        keys = _gather(key_cache, blocks)  # [num_decodes, num_kv_heads, width * block_size, D]
        values = _gather(value_cache, blocks)
        mask = torch.arange(keys.shape[2]) < seq_lens[:, None]  # [num_decodes, max_len]
        out = self._sdpa(q.unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :])
        return out.squeeze(2)

    def _prefill(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_len: int,
    ) -> torch.Tensor:
        """One request; its query token i sits at position seq_len - query_len + i."""
        block_size = key_cache.shape[2]
        blocks = block_table[: -(-seq_len // block_size)]
        keys = _gather(key_cache, blocks[None])[0, :, :seq_len]  # [num_kv_heads, seq_len, D]
        values = _gather(value_cache, blocks[None])[0, :, :seq_len]
        query_len = q.shape[0]
        context_len = seq_len - query_len
        if context_len == 0:
            out = self._sdpa(q.transpose(0, 1), keys, values, is_causal=True)
        else:
            # SDPA's is_causal aligns the mask top-left; cached context shifts it right.
            mask = torch.ones(query_len, seq_len, dtype=torch.bool).tril(context_len)
            out = self._sdpa(q.transpose(0, 1), keys, values, attn_mask=mask)
        return out.transpose(0, 1)

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, scale=self.scale, enable_gqa=self.num_queries_per_kv > 1, **kwargs
        )


def _rows(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` rows; the tensor itself when it has no more (a slice costs
    a microsecond or two, paid per layer and step)."""
    return tensor if tensor.shape[0] == count else tensor[:count]


def _gather(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The ``blocks`` [batch, n] of ``cache`` [num_blocks, heads, block_size, D] as
    [batch, heads, n * block_size, D], in one copy: gathered heads first, so that each
    head's tokens lie together without a second."""
    return cache.transpose(0, 1)[:, blocks].flatten(2, 3).transpose(0, 1)


@dataclass(frozen=True)
class _StepPlan:
    """What every layer of a mixed step shares: where the new tokens go (checked against
    the cache size) and the requests' query rows and lengths on the host."""

    blocks: torch.Tensor
    offsets: torch.Tensor
    starts: list[int]
    seq_lens: list[int]


def _step_plan(metadata: AttentionMetadata, num_blocks: int, block_size: int) -> _StepPlan:
    """The step's plan for caches of ``num_blocks`` blocks of ``block_size``, worked out
    by the step's first layer (``metadata.step_cache``) and reused by the others."""
    key = ("CPU_SDPA", num_blocks, block_size)
    plan = metadata.step_cache.get(key)
    if plan is None:
        slot_mapping = metadata.slot_mapping
        if slot_mapping.numel():
            low, high = int(slot_mapping.min()), int(slot_mapping.max())
            if low < 0 or high >= num_blocks * block_size:
                raise IndexError(
                    f"CPU_SDPA: slot_mapping holds slots {low} to {high}, outside this "
                    f"cache's 0 to {num_blocks * block_size - 1}"
                )
        plan = metadata.step_cache[key] = _StepPlan(
            blocks=slot_mapping // block_size,
            offsets=slot_mapping % block_size,
            starts=metadata.query_start_loc.tolist(),
            seq_lens=metadata.seq_lens.tolist(),
        )
    return plan


def _write(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, plan: _StepPlan) -> None:
    """Store ``key``/``value`` [num_tokens, num_kv_heads, head_size] at the plan's slots
    in the head-major cache (the core's ``write_to_kv_cache`` writes its token-major one)."""
    kv_cache[0].transpose(1, 2)[plan.blocks, plan.offsets] = key
    kv_cache[1].transpose(1, 2)[plan.blocks, plan.offsets] = value
