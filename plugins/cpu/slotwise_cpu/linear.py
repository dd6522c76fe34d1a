"""``torch.ops.slotwise_cpu.linear``: ``F.linear`` whose products of a few rows run the
plugin's C kernel (``csrc/small_gemm.c``).

Why: a decode step of a few requests is a chain of products of a few rows that read
every weight once, so it runs at the speed the weights stream from memory.  torch's
bfloat16 and float16 GEMM (oneDNN) spends more time converting than streaming there, and
MKL's float32 GEMM reads the weight again for every few rows; the kernel reads it once
for up to 16 rows (bfloat16 pairs multiplied with AVX512-BF16).  Above the rows where
torch catches up (``KERNEL_DTYPES``), calls go to ``F.linear`` unchanged.

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
#: The dtypes the kernel takes: its code for each, and the most rows for which it beat
#: torch's GEMM on this plugin's benchmark machine (docs/benchmarks.md): oneDNN's bfloat16
#: GEMM (AMX) catches up at 8 rows, MKL's float32 GEMM at 16; float16 was still 1.3x
#: slower at 8.  Everything else goes to ``F.linear``.
KERNEL_DTYPES: dict[torch.dtype, tuple[int, int]] = {
    torch.float32: (0, 8),
    torch.bfloat16: (1, 4),
    torch.float16: (2, 8),
}

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
    """Whether products of a few rows with weights of this dtype run the kernel here."""
    return weight_dtype in KERNEL_DTYPES and kernel() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: by the kernel for the few rows ``KERNEL_DTYPES``
    gives it in a dtype it takes, else by torch.

    Runs once per linear layer and step, so its checks are ordered to cost the least:
    each attribute read is a few hundred nanoseconds, 32 times a step.
    """
    code, max_rows = KERNEL_DTYPES.get(x.dtype, (None, 0))
    function = kernel() if code is not None else None
    shape = x.shape
    if (
        function is None
        or len(shape) != 2
        or shape[0] > max_rows
        or weight.dtype != x.dtype
        or shape[1] != weight.shape[1]
        or x.stride()[1] != 1
        or not weight.is_contiguous()
        or (bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous()))
    ):
        return F.linear(x, weight, bias)
    rows, inner = shape
    outputs = weight.shape[0]
    out = torch.empty(rows, outputs, dtype=x.dtype)
    status = function(
        x.data_ptr(), x.stride()[0], weight.data_ptr(),
        None if bias is None else bias.data_ptr(), out.data_ptr(), outputs,
        rows, outputs, inner, code, torch.get_num_threads(),
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
