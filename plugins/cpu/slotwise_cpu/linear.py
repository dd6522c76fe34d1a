"""``torch.ops.slotwise_cpu.linear``: ``F.linear`` whose products of a few rows run the
plugin's C kernel (``csrc/small_gemm.c``).

Why: a decode step of a few requests is a chain of products of a few rows that read
every weight once, so it runs at the speed the weights stream from memory.  torch's
bfloat16 and float16 GEMM (oneDNN) spends more time converting than streaming there, and
MKL's float32 GEMM reads the weight again for every few rows; the kernel reads it once
for up to 16 rows (bfloat16 on AMX tiles from 3 rows where the CPU has them, in pairs
with AVX512-BF16 otherwise, widened to float32 on a CPU with AVX2 alone).  Above the
rows where torch catches up (``max_kernel_rows``), calls go to ``F.linear``; in bfloat16
and float16 in float32 (rounded once) where torch's GEMM has no fast path in the dtype,
as on a CPU without AVX-512, where its generic loop is 6x to 8x slower.

The op's CPU kernel, which chooses between the two, is C++ (``csrc/ops.cpp``, loaded by
``slotwise_cpu.native``): it runs once per linear layer and step, and a kernel written
in Python would cost more than the small GEMM saves on a small layer.  Until that
library is loaded, and where it cannot be built, the op's kernel is the Python one below.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch
import torch.nn.functional as F

from slotwise_cpu import native

logger = logging.getLogger("slotwise")

#: The op's qualified name.
LINEAR_OP = "slotwise_cpu::linear"
#: The dtypes the kernel takes, with the codes the C side knows them by (csrc/scalars.h).
KERNEL_DTYPES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_library = torch.library.Library("slotwise_cpu", "FRAGMENT")
_library.define("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
#: The op, to call: ``linear_op(x, weight, bias)``.
linear_op = torch.ops.slotwise_cpu.linear.default


def runs_kernel(weight_dtype: torch.dtype) -> bool:
    """Whether products of a few rows with weights of this dtype run the kernel here
    (not where it cannot be built, nor on a CPU without AVX-512 or AVX2:
    ``max_kernel_rows``)."""
    return max_kernel_rows(weight_dtype) > 0


def max_kernel_rows(dtype: torch.dtype) -> int:
    """The most rows the op gives the kernel in ``dtype`` (0: none); more go to torch."""
    library = native.load_kernels()
    if library is None or dtype not in KERNEL_DTYPES:
        return 0
    function = library.slotwise_cpu_max_kernel_rows
    function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int64
    rows = function(KERNEL_DTYPES[dtype])
    if rows == 0:
        _say_torch_multiplies()
    return rows


@functools.cache
def _say_torch_multiplies() -> None:
    logger.info(
        "slotwise_cpu: linear layers run torch's GEMM: the plugin's small GEMM has vector "
        "code for AVX-512 and AVX2 only, which this CPU lacks"
    )


def _linear_before_the_kernels(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The op's kernel where the C++ one is not registered: on the first CPU call, load
    the kernels library and call the op again, which then reaches it; ``F.linear``
    otherwise (other devices; no library, which ``load_kernels`` warned about)."""
    if x.device.type == "cpu" and native.load_kernels() is not None:
        return linear_op(x, weight, bias)
    return F.linear(x, weight, bias)


_library.impl("linear", _linear_before_the_kernels, "CompositeExplicitAutograd")


@torch.library.register_fake(LINEAR_OP)
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
