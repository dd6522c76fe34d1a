"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import nn

from slotwise.custom_op import CustomOp


class RMSNorm(CustomOp):
    """``x / rms(x) * weight``, computed in float32.

    With ``residual``, adds it first and returns ``(normed, x + residual)``: the
    pre-norm transformer pattern, which kernels fuse into one pass.
    """

    op_name = "rms_norm"

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        x32 = x.float()
        variance = x32.pow(2).mean(dim=-1, keepdim=True)
        normed = (x32 * torch.rsqrt(variance + self.eps) * self.weight.float()).to(x.dtype)
        return normed if residual is None else (normed, residual)

    def forward_cpu(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        normed = torch.nn.functional.rms_norm(
            x.float(), (x.shape[-1],), self.weight.float(), eps=self.eps
        ).to(x.dtype)
        return normed if residual is None else (normed, residual)
