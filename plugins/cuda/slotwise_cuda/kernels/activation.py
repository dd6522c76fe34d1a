"""SiLU-and-multiply, the gate of gated MLPs: ``silu(x[:, :d]) * x[:, d:]``.

Fused so the ``[num_tokens, 2 * d]`` projection is read once and only ``d`` columns are
written. Computed in fp32, rounded once on store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from slotwise_cuda.kernels._checks import FLOAT_DTYPES, check_tensor

_MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=ok, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * out_stride + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    """Write ``silu(x[:, :d]) * x[:, d:]`` for ``x`` ``[num_tokens, 2 * d]`` into ``out``
    ``[num_tokens, d]`` (same dtype)."""
    check_tensor("x", x, "[num_tokens, 2 * d]", (None, None), FLOAT_DTYPES)
    num_tokens, width = x.shape
    if width % 2:
        raise ValueError(f"x: expected shape [num_tokens, 2 * d], got odd width {width}")
    d = width // 2
    check_tensor("out", out, "[num_tokens, d]", (num_tokens, d), (x.dtype,), x.device)
    if num_tokens == 0 or d == 0:
        return
    block = min(_MAX_BLOCK, triton.next_power_of_2(d))
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(d, block))](
        x, out, x.stride(0), out.stride(0), d, BLOCK=block
    )
