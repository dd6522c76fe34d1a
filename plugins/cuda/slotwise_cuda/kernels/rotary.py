"""Rotary position embedding, applied in place to query and key.

Each pair (x1, x2) of a head becomes ``(x1 cos - x2 sin, x2 cos + x1 sin)`` with the
cos/sin of the token's position. Neox style pairs element i with i + head_size / 2;
gpt-j style pairs 2i with 2i + 1. One program per token: it reads the position's
cos/sin row once and rotates every query and key head with it. The rotation covers the
whole head (rotary_dim == head_size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from slotwise_cuda.kernels._checks import FLOAT_DTYPES, check_tensor


@triton.jit
def _rotate_heads(
    x_ptr,
    num_heads,
    cos,
    sin,
    HEAD_SIZE: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    """Rotate ``num_heads`` heads stored back to back from ``x_ptr``."""
    HALF: tl.constexpr = HEAD_SIZE // 2
    heads = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    if IS_NEOX:
        first = i
        second = i + HALF
    else:
        first = 2 * i
        second = 2 * i + 1
    ok = (heads[:, None] < num_heads) & (i[None, :] < HALF)
    base = x_ptr + heads[:, None] * HEAD_SIZE
    x1 = tl.load(base + first[None, :], mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(base + second[None, :], mask=ok, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(base + first[None, :], (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype), mask=ok)
    tl.store(base + second[None, :], (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype), mask=ok)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    query_ptr,
    key_ptr,
    cos_sin_ptr,
    query_stride,
    key_stride,
    cos_sin_stride,
    num_heads,
    num_kv_heads,
    HEAD_SIZE: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_SIZE // 2
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    row = cos_sin_ptr + pos * cos_sin_stride
    cos = tl.load(row + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
    query_row = query_ptr + token * query_stride
    key_row = key_ptr + token * key_stride
    _rotate_heads(query_row, num_heads, cos, sin, HEAD_SIZE, BLOCK_HALF, BLOCK_HQ, IS_NEOX)
    _rotate_heads(key_row, num_kv_heads, cos, sin, HEAD_SIZE, BLOCK_HALF, BLOCK_HK, IS_NEOX)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool,
) -> None:
    """Rotate ``query`` ``[num_tokens, num_heads * head_size]`` and ``key``
    ``[num_tokens, num_kv_heads * head_size]`` in place by the angles of ``positions``
    ``[num_tokens]`` (int32 or int64). ``cos_sin_cache`` ``[max_position, head_size]``
    holds cos in its first half of columns and sin in its second half."""
    if head_size <= 0 or head_size % 2:
        raise ValueError(f"head_size: expected a positive even number, got {head_size}")
    check_tensor("query", query, "[num_tokens, num_heads * head_size]", (None, None), FLOAT_DTYPES)
    num_tokens = query.shape[0]
    device = query.device
    check_tensor(
        "key",
        key,
        "[num_tokens, num_kv_heads * head_size]",
        (num_tokens, None),
        (query.dtype,),
        device,
    )
    for name, tensor in (("query", query), ("key", key)):
        if tensor.shape[1] % head_size:
            raise ValueError(
                f"{name}: width {tensor.shape[1]} is not a multiple of head_size {head_size}"
            )
    check_tensor(
        "positions", positions, "[num_tokens]", (num_tokens,), (torch.int32, torch.int64), device
    )
    check_tensor(
        "cos_sin_cache",
        cos_sin_cache,
        "[max_position, rotary_dim == head_size]",
        (None, head_size),
        FLOAT_DTYPES,
        device,
    )
    if num_tokens == 0:
        return
    num_heads = query.shape[1] // head_size
    num_kv_heads = key.shape[1] // head_size
    _rotary_kernel[(num_tokens,)](
        positions,
        query,
        key,
        cos_sin_cache,
        query.stride(0),
        key.stride(0),
        cos_sin_cache.stride(0),
        num_heads,
        num_kv_heads,
        HEAD_SIZE=head_size,
        BLOCK_HALF=triton.next_power_of_2(head_size // 2),
        BLOCK_HQ=triton.next_power_of_2(num_heads),
        BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        IS_NEOX=is_neox,
    )
