"""RMSNorm: ``x * rsqrt(mean(x**2) + eps) * weight`` per row.

One program per token. The row is read in chunks, twice (sum of squares, then scale),
so any hidden size fits in registers; the second read is usually served from cache.
Everything is computed in fp32 and rounded once on store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from slotwise_cuda.kernels._checks import FLOAT_DTYPES, check_tensor

_MAX_BLOCK = 4096


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    x_stride,
    out_stride,
    hidden,
    eps,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    out_row = out_ptr + row * out_stride
    cols = tl.arange(0, BLOCK)

    squares = tl.zeros([BLOCK], tl.float32)
    for start in range(0, hidden, BLOCK):
        ok = start + cols < hidden
        x = tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
        squares += x * x
    inv_rms = tl.rsqrt(tl.sum(squares, 0) / hidden + eps)

    for start in range(0, hidden, BLOCK):
        ok = start + cols < hidden
        x = tl.load(x_row + start + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(weight_ptr + start + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_row + start + cols, (x * inv_rms * w).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Write RMSNorm of ``x`` ``[num_tokens, hidden]`` scaled by ``weight`` ``[hidden]``
    into ``out`` (same shape and dtype as ``x``; ``weight`` may be any float dtype)."""
    check_tensor("x", x, "[num_tokens, hidden]", (None, None), FLOAT_DTYPES)
    num_tokens, hidden = x.shape
    check_tensor("weight", weight, "[hidden]", (hidden,), FLOAT_DTYPES, x.device)
    check_tensor("out", out, "[num_tokens, hidden]", x.shape, (x.dtype,), x.device)
    if num_tokens == 0:
        return
    block = min(_MAX_BLOCK, triton.next_power_of_2(hidden))
    _rms_norm_kernel[(num_tokens,)](
        x,
        weight,
        out,
        x.stride(0),
        out.stride(0),
        hidden,
        eps,
        BLOCK=block,
        num_warps=min(16, max(1, block // 256)),
    )
