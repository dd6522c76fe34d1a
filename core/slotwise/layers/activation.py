"""SwiGLU's gate: ``silu(gate) * up`` over the two halves of one projection."""

from __future__ import annotations

import torch

from slotwise.custom_op import CustomOp


class SiluAndMul(CustomOp):
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2 * d]``; the result
    is ``[..., d]``, in ``x``'s dtype.  A plugin replacement is ``fn(layer, x)``."""

    op_name = "silu_and_mul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
