"""``torch.ops.slotwise_cpu.linear``: ``F.linear`` whose one-row products run the plugin's
C kernel (``csrc/small_gemm.c``).

Why: a batch-1 decode step is a chain of matrix-vector products that read every weight
once, so it runs at the speed the weights stream from memory.  torch's bfloat16 and
float16 GEMM (oneDNN) spends more time converting than streaming at one row; the kernel
multiplies bfloat16 pairs with AVX512-BF16 and keeps pace with memory (measured in
docs/benchmarks.md).  For float32, MKL's GEMV is already as fast, and from two rows on
torch's GEMM is: those calls go to ``F.linear`` unchanged.

The op is registered with ``torch.library.Library`` rather than ``custom_op``: it runs
once per linear layer and step, and the latter's Python wrappers would cost more than
the kernel saves on a small layer.
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from slotwise_cpu.native import kernel_function

#: The op's qualified name.
LINEAR_OP = "slotwise_cpu::linear"
#: The dtypes and most rows the kernel takes; everything else goes to ``F.linear``.
KERNEL_DTYPES = {torch.bfloat16: 1, torch.float16: 2}
MAX_ROWS = 1

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p

_library = torch.library.Library("slotwise_cpu", "DEF")
_library.define("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")


@functools.cache
def kernel() -> ctypes._CFuncPtr | None:
    """The C function, or None (with one warning saying why) when it cannot be built."""
    argtypes = [
        _PTR, _I64, _PTR, _PTR, _PTR, _I64,  # x, its row stride, weight, bias, out, its stride
        _I64, _I64, _I64, ctypes.c_int, ctypes.c_int,  # m, n, k, dtype code, threads
    ]  # fmt: skip
    return kernel_function(
        "small_gemm", "slotwise_small_gemm", argtypes, "linear layers run torch's GEMM"
    )


def runs_kernel(weight_dtype: torch.dtype) -> bool:
    """Whether one-row products with weights of this dtype run the kernel here."""
    return weight_dtype in KERNEL_DTYPES and kernel() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: by the kernel for one row of a kernel dtype, else by
    torch."""
    function = kernel()
    if (
        function is None
        or x.dim() != 2
        or x.shape[0] > MAX_ROWS
        or x.dtype not in KERNEL_DTYPES
        or weight.dtype is not x.dtype
        or (bias is not None and (bias.dtype is not x.dtype or not bias.is_contiguous()))
        or not weight.is_contiguous()
        or x.stride()[1] != 1
        or x.shape[1] != weight.shape[1]
    ):
        return F.linear(x, weight, bias)
    rows, inner = x.shape
    outputs = weight.shape[0]
    out = torch.empty(rows, outputs, dtype=x.dtype)
    status = function(
        x.data_ptr(), x.stride()[0], weight.data_ptr(),
        None if bias is None else bias.data_ptr(), out.data_ptr(), outputs,
        rows, outputs, inner, KERNEL_DTYPES[x.dtype], torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(
            f"slotwise_cpu.linear: the kernel refused {rows}x{inner} @ {inner}x{outputs}"
        )
    return out


_library.impl("linear", linear, "CPU")


@torch.library.register_fake(LINEAR_OP)
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
