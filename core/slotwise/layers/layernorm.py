"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from slotwise.custom_op import CustomOp


def norm_with_residual(
    norm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, residual: torch.Tensor | None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)``.

    Why one helper: every RMSNorm implementation, the plugins' kernels included, must
    treat the residual alike; only ``norm`` differs between them.
    """
    if residual is None:
        return norm(x)
    x = x + residual
    return norm(x), x


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
        return norm_with_residual(self._norm_native, x, residual)

    def forward_cpu(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return norm_with_residual(self._norm_cpu, x, residual)

    def _norm_native(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        variance = x32.pow(2).mean(dim=-1, keepdim=True)
        return (x32 * torch.rsqrt(variance + self.eps) * self.weight.float()).to(x.dtype)

    def _norm_cpu(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(
            x.float(), (x.shape[-1],), self.weight.float(), eps=self.eps
        ).to(x.dtype)
