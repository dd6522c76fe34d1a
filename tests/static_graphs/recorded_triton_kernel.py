"""A Triton kernel of the test's own, ``out = 2 * x + 1``: the launch a recorded graph
must record, like any plugin's kernel, though the dispatcher never sees it.

Imported through ``slotwise.testing.triton_interpreter.import_interpreted`` so that,
without a GPU, it runs in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _double_plus_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < n
    x = tl.load(x_ptr + offsets, mask=ok, other=0.0)
    tl.store(out_ptr + offsets, x * 2.0 + 1.0, mask=ok)


def double_plus_one(x: torch.Tensor, out: torch.Tensor) -> None:
    """Write ``2 * x + 1`` into ``out`` (contiguous, same shape) with one launch."""
    block = triton.next_power_of_2(x.numel())
    _double_plus_one_kernel[(1,)](x, out, x.numel(), BLOCK=block)
