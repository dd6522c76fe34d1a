"""The stub's own RMSNorm, replacing slotwise's on this platform without model changes.

Registered in plugin.py through the ``slotwise_register_custom_ops`` hook.  A real
vendor would call its fused kernel here, behind a torch op of its own: level 3 traces
this function with the batch size as a symbol, which a kernel launcher's Python cannot
take (``slotwise_cuda/custom_ops.py`` shows how).  The function takes the layer first,
like a method, and returns what ``RMSNorm.forward_native`` returns.
"""

from __future__ import annotations

import torch

from slotwise.plugin_api import RMSNorm, norm_with_residual


def rms_norm(
    layer: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    def norm(x: torch.Tensor) -> torch.Tensor:
        mean_square = x.float().square().mean(dim=-1, keepdim=True)
        normed = x.float() * (mean_square + layer.eps).rsqrt() * layer.weight.float()
        return normed.to(x.dtype)

    # The residual add is slotwise's helper, so every implementation returns the same.
    return norm_with_residual(norm, x, residual)
