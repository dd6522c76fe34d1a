"""Attention over a paged KV cache, for prefill, chunked prefill and decode.

Cache layout: ``k_cache`` and ``v_cache`` are each ``[num_blocks, block_size,
num_kv_heads, head_size]``; token position p of sequence s lives in block
``block_table[s, p // block_size]`` at slot ``p % block_size``.

One kernel serves both launchers. A program owns one KV head and a tile of query rows;
the rows are (query token, query head) pairs of the heads sharing that KV head, so each
K/V tile is loaded once per group rather than once per query head. K/V are walked in
tiles of ``_BLOCK_N`` positions gathered slot by slot through the block table, so any
cache block size works and tiles keep the minimum size ``tl.dot`` accepts. Softmax is
online (running max and sum in fp32, base 2 with the scale folded in).

The prefill grid is sized from ``q.shape[0]`` alone (``num_tokens // BLOCK_Q +
num_seqs`` query tiles is an upper bound) and each program finds its sequence by binary
search over ``query_start_loc``: no host synchronisation, so the launch can be captured
in a CUDA graph. Spare programs return at once.

Launches go through ``bound_launch``: the compiled kernel is bound once per layout,
dtype and alignment of the arguments and launched without Triton's JIT.  The values
that change from step to step (the number of sequences, the block table's width, the
addresses of the step's int32 views, which start wherever the batch's decodes end)
are kept out of the kernel's specialisation, so neither path compiles again for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from slotwise_cuda.kernels._checks import FLOAT_DTYPES, check_tensor
from slotwise_cuda.kernels.bound_launch import KernelLauncher, LaunchPlan

# K/V positions per tile. fp32 tiles take twice the shared memory; 32 keeps head size 128
# under the ~99 KiB that consumer GPUs (sm_86/sm_89) give a block.
_BLOCK_N = {torch.float32: 32, torch.float16: 64, torch.bfloat16: 64}
_PREFILL_ROWS = 64
_DECODE_ROWS = 16
# Masked scores. Finite, unlike -inf, so rows with nothing to attend to (padding rows)
# never compute inf - inf.
_MASKED = tl.constexpr(-1.0e30)


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q: tl.constexpr):
    """Last sequence s whose first query tile, ``query_start_loc[s] // BLOCK_Q + s``, is
    at most ``tile_id``. That first-tile index grows with s and leaves each sequence at
    least ``cdiv(query_len, BLOCK_Q)`` tiles."""
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile_id:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit(
    do_not_specialize=["num_seqs", "block_table_stride"],
    do_not_specialize_on_alignment=["block_table_ptr", "query_start_loc_ptr", "seq_lens_ptr"],
)
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,
    num_seqs,
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    k_stride_b,
    k_stride_s,
    k_stride_h,
    v_stride_b,
    v_stride_s,
    v_stride_h,
    block_table_stride,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CACHE_BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DECODE: tl.constexpr,
):
    kv_head = tl.program_id(1)
    if DECODE:
        # One query token per sequence, token index == sequence index.
        seq = tl.program_id(0)
        q_start = seq
        q_len = 1
        q_tile = 0
    else:
        tile_id = tl.program_id(0)
        seq = _find_seq(query_start_loc_ptr, num_seqs, tile_id, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_tile = tile_id - (q_start // BLOCK_Q + seq)
        if q_tile * BLOCK_Q >= q_len:
            return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    q_pos = context_len + q_idx
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE

    token = q_start + q_idx
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(
        q_ptr + token[:, None] * q_stride_t + head[:, None] * q_stride_h + d[None, :],
        mask=q_mask,
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], _MASKED, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys past the last query position of this tile are never attended to.
    kv_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)
    bt_row = block_table_ptr + seq.to(tl.int64) * block_table_stride
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < kv_end
        block = tl.load(bt_row + pos // CACHE_BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        slot = pos % CACHE_BLOCK_SIZE
        k_off = block * k_stride_b + slot * k_stride_s + kv_head * k_stride_h
        k = tl.load(
            k_cache_ptr + k_off[None, :] + d[:, None],
            mask=pos_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        scores = tl.dot(q, k, input_precision="ieee") * scale_log2
        scores = tl.where(pos[None, :] <= q_pos[:, None], scores, _MASKED)

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        v_off = block * v_stride_b + slot * v_stride_s + kv_head * v_stride_h
        v = tl.load(
            v_cache_ptr + v_off[:, None] + d[None, :],
            mask=pos_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(
        out_ptr + token[:, None] * out_stride_t + head[:, None] * out_stride_h + d[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def _check_common(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    q_layout: str,
) -> None:
    check_tensor("q", q, q_layout, (None, None, None), FLOAT_DTYPES)
    num_heads, head_size = q.shape[1:]
    device = q.device
    check_tensor("seq_lens", seq_lens, "[num_seqs]", (None,), (torch.int32,), device)
    num_seqs = seq_lens.shape[0]
    cache_layout = "[num_blocks, block_size, num_kv_heads, head_size]"
    check_tensor(
        "k_cache", k_cache, cache_layout, (None, None, None, head_size), (q.dtype,), device
    )
    check_tensor("v_cache", v_cache, cache_layout, k_cache.shape, (q.dtype,), device)
    num_kv_heads = k_cache.shape[2]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"k_cache: num_kv_heads ({num_kv_heads}) must divide q's num_heads ({num_heads})"
        )
    check_tensor(
        "block_table",
        block_table,
        "[num_seqs, max_blocks_per_seq]",
        (num_seqs, None),
        (torch.int32,),
        device,
    )
    check_tensor("out", out, q_layout, q.shape, (q.dtype,), device)


_LOG2_E = math.log2(math.e)
#: The kernel's launches, bound once per key for the whole process.
_paged_attention_launcher = KernelLauncher(_paged_attention_kernel)
#: The arguments whose alignment the kernel specialises on: q, k_cache, v_cache, out.
_ALIGNED = (0, 1, 2, 3)


class PagedAttentionLaunch:
    """The kernel's launch for one layout of its arguments, checked and configured once.

    Checking the arguments and working out the grid, the tile sizes and the strides cost
    more host time than the launch itself.  A binding does both once, for the shapes,
    strides, dtypes and devices of the tensors it is made with; calling it launches on
    tensors of that same layout without checking again.  Every layer of a step shares
    one layout, so a backend binds once per step shape (``AttentionMetadata.layout_cache``,
    kept across the steps a runner makes over the same buffers).
    Its launches go through a ``LaunchPlan`` of the module's ``KernelLauncher``, which
    keeps Triton's compiled kernel across steps.
    ``query_start_loc`` None binds the decode kernel (one query token per sequence).
    """

    def __init__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        query_start_loc: torch.Tensor | None = None,
    ) -> None:
        decode = query_start_loc is None
        layout = (
            "[num_seqs, num_heads, head_size]" if decode else "[num_tokens, num_heads, head_size]"
        )
        _check_common(q, k_cache, v_cache, block_table, seq_lens, out, layout)
        num_seqs = seq_lens.shape[0]
        if decode and q.shape[0] != num_seqs:
            raise ValueError(
                f"q: expected shape {layout} with num_seqs = {num_seqs} "
                f"(from seq_lens), got {tuple(q.shape)}"
            )
        if query_start_loc is not None:
            check_tensor(
                "query_start_loc",
                query_start_loc,
                "[num_seqs + 1]",
                (num_seqs + 1,),
                (torch.int32,),
                q.device,
            )
        num_heads, head_size = q.shape[1:]
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        block_m = max(_DECODE_ROWS if decode else _PREFILL_ROWS, triton.next_power_of_2(group))
        block_q = block_m // group
        num_q_tiles = num_seqs if decode else q.shape[0] // block_q + num_seqs
        #: None when there is no sequence, hence nothing to launch.
        self.grid = (num_q_tiles, num_kv_heads) if num_seqs else None
        self.num_seqs = num_seqs
        self.strides = (
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            *k_cache.stride()[:3],
            *v_cache.stride()[:3],
            block_table.stride(0),
        )
        self.constants = {
            "HEAD_SIZE": head_size,
            "BLOCK_D": max(16, triton.next_power_of_2(head_size)),
            "CACHE_BLOCK_SIZE": k_cache.shape[1],
            "GROUP": group,
            "BLOCK_Q": block_q,
            "BLOCK_M": block_m,
            "BLOCK_N": _BLOCK_N[q.dtype],
            "DECODE": decode,
        }
        #: None when there is no sequence, hence nothing to launch.
        self.launch: LaunchPlan | None = None
        if self.grid is not None:
            # What Triton specialises on besides the aligned pointers' addresses: the
            # dtypes, the strides (the block table's is not specialised) and constexprs.
            key = (q.device, q.dtype, self.strides[:-1], tuple(self.constants.values()))
            self.launch = _paged_attention_launcher.plan(self.grid, self.constants, key, _ALIGNED)

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        query_start_loc: torch.Tensor | None = None,
    ) -> None:
        """Launch on tensors laid out as the ones this binding was made with."""
        if self.launch is None:
            return
        self.launch(
            *self._arguments(
                q, k_cache, v_cache, block_table, seq_lens, out, scale, query_start_loc
            )
        )

    def bind(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        query_start_loc: torch.Tensor | None = None,
    ) -> Callable[[], None]:
        """A call that launches on these very tensors, whatever they hold when it is
        called, with nothing checked or looked up (``LaunchPlan.bind``): for a caller
        that launches on the same tensors step after step."""
        if self.launch is None:
            return _nothing
        return self.launch.bind(
            *self._arguments(
                q, k_cache, v_cache, block_table, seq_lens, out, scale, query_start_loc
            )
        )

    def _arguments(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        scale: float,
        query_start_loc: torch.Tensor | None,
    ) -> tuple[Any, ...]:
        """The kernel's arguments, in its order."""
        # The decode kernel does not read query_start_loc; seq_lens stands in.
        return (
            q,
            k_cache,
            v_cache,
            out,
            block_table,
            seq_lens if query_start_loc is None else query_start_loc,
            seq_lens,
            scale * _LOG2_E,
            self.num_seqs,
            *self.strides,
        )


def _nothing() -> None:
    """The launch of a step part without sequences."""


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Causal attention for the query tokens of a batch of sequences into ``out``.

    ``q``/``out``: ``[num_tokens, num_heads, head_size]``; ``query_start_loc`` int32
    ``[num_seqs + 1]``; ``seq_lens`` int32 ``[num_seqs]``, each sequence's total length
    including its new tokens, whose K/V are already in the cache. Query token i of
    sequence s sits at position ``seq_lens[s] - query_len_s + i`` and attends to cache
    positions up to and including it. Tokens past ``query_start_loc[-1]`` (padding) are
    left untouched in ``out``.
    """
    launch = PagedAttentionLaunch(q, k_cache, v_cache, block_table, seq_lens, out, query_start_loc)
    launch(q, k_cache, v_cache, block_table, seq_lens, out, scale, query_start_loc)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Attention for one query token per sequence into ``out``.

    ``q``/``out``: ``[num_seqs, num_heads, head_size]``; the token of sequence s sits at
    position ``seq_lens[s] - 1`` and attends to positions ``0..seq_lens[s] - 1``.
    """
    launch = PagedAttentionLaunch(q, k_cache, v_cache, block_table, seq_lens, out)
    launch(q, k_cache, v_cache, block_table, seq_lens, out, scale)
