"""SwiGLU's gate: ``silu(gate) * up`` over the two halves of one projection."""

from __future__ import annotations

import torch

from slotwise.custom_op import CustomOp


class SiluAndMul(CustomOp):
    op_name = "silu_and_mul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
