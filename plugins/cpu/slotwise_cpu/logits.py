"""The CPU's ``logits`` custom op: the LM head's product on the small-GEMM kernel.

Why: a decode step's LM head reads the largest weight of a small model for a few rows,
after the compiled model has run; torch's bfloat16 GEMM streams it at half the memory's
rate (docs/cpu-kernels.md), the plugin's kernel at its full rate.
"""

from __future__ import annotations

import torch

from slotwise.plugin_api import CustomOp
from slotwise_cpu.linear import linear_op


def logits(layer: CustomOp, lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``lm_head(hidden).float()``; by the kernel when it takes the product (a few rows, a
    weight this process holds whole), else as the layer would."""
    if getattr(lm_head, "tp_size", 1) != 1:
        return layer.forward_native(lm_head, hidden)  # each rank's slice is all-gathered
    if torch.is_grad_enabled() and lm_head.weight.requires_grad:
        return layer.forward_native(lm_head, hidden)  # the kernel has no backward
    return linear_op(hidden, lm_head.weight, None).float()
