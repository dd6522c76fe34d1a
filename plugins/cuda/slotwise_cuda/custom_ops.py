"""Triton implementations of slotwise's custom ops, registered for the ``cuda`` platform.

Each function takes the layer first, like a method, and matches the layer's
``forward_native`` in arguments and results.
"""

from __future__ import annotations

import torch

from slotwise.plugin_api import RMSNorm, RotaryEmbedding, SiluAndMul, norm_with_residual
from slotwise_cuda.kernels import activation, layernorm, rotary


def rms_norm(
    layer: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    def norm(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(flat)
        layernorm.rms_norm(flat, layer.weight, layer.eps, out)
        return out.view_as(x)

    return norm_with_residual(norm, x, residual)


def silu_and_mul(layer: SiluAndMul, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(flat.shape[0], flat.shape[1] // 2, dtype=x.dtype, device=x.device)
    activation.silu_and_mul(flat, out)
    return out.view(*x.shape[:-1], x.shape[-1] // 2)


def rotary_embedding(
    layer: RotaryEmbedding, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    query, key = query.contiguous().clone(), key.contiguous().clone()
    rotary.rotary_embedding(
        positions, query, key, layer.cos_sin_cache, layer.head_size, layer.is_neox_style
    )
    return query, key
