"""Triton implementations of slotwise's custom ops, registered for the ``cuda`` platform.

Each kernel launch sits behind a torch op of its own (``torch.ops.slotwise_cuda.*``), so
Dynamo records one opaque node instead of tracing the launcher's Python. The launchers
check their arguments and skip empty launches, which a trace cannot do on a batch size
that is a symbol: on a GPU, a level-3 compile of a model failed there ("Could not guard
on data-dependent expression") before the launchers had these ops.

The functions below take the layer first, like a method, and match the layer's
``forward_native`` in arguments and results.
"""

from __future__ import annotations

import torch

from slotwise.plugin_api import RMSNorm, RotaryEmbedding, SiluAndMul, norm_with_residual
from slotwise_cuda.kernels import activation, layernorm, rotary

_library = torch.library.Library("slotwise_cuda", "FRAGMENT")
_library.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")
_library.define("silu_and_mul(Tensor x) -> Tensor")
_library.define(
    "rotary_embedding(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, "
    "int head_size, bool is_neox_style) -> (Tensor, Tensor)"
)


def rms_norm(
    layer: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    def norm(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        return torch.ops.slotwise_cuda.rms_norm(flat, layer.weight, layer.eps).view_as(x)

    return norm_with_residual(norm, x, residual)


def silu_and_mul(layer: SiluAndMul, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.slotwise_cuda.silu_and_mul(flat)
    return out.view(*x.shape[:-1], x.shape[-1] // 2)


def rotary_embedding(
    layer: RotaryEmbedding, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.slotwise_cuda.rotary_embedding(
        positions, query, key, layer.cos_sin_cache, layer.head_size, layer.is_neox_style
    )


# -- the ops' kernels (any device: Triton's interpreter runs them on CPU tensors) and
# -- their fake versions (shapes only, for tracing)


def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    layernorm.rms_norm(x, weight, eps, out)
    return out


def _silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.shape[0], x.shape[1] // 2)
    activation.silu_and_mul(x, out)
    return out


def _rotary_embedding_op(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    query, key = query.contiguous().clone(), key.contiguous().clone()
    rotary.rotary_embedding(positions, query, key, cos_sin_cache, head_size, is_neox_style)
    return query, key


_library.impl("rms_norm", _rms_norm_op, "CompositeExplicitAutograd")
_library.impl("silu_and_mul", _silu_and_mul_op, "CompositeExplicitAutograd")
_library.impl("rotary_embedding", _rotary_embedding_op, "CompositeExplicitAutograd")


@torch.library.register_fake("slotwise_cuda::rms_norm")
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.register_fake("slotwise_cuda::silu_and_mul")
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1] // 2)


@torch.library.register_fake("slotwise_cuda::rotary_embedding")
def _(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    contiguous = torch.contiguous_format
    return torch.empty_like(query, memory_format=contiguous), torch.empty_like(
        key, memory_format=contiguous
    )
