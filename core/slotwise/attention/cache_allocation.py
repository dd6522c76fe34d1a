"""Giving a model's attention layers their KV caches, each in its backend's layout.

Kept apart from kv_cache.py, which the layer itself uses: this module uses the layer.
"""

from __future__ import annotations

import torch

from slotwise.attention.layer import Attention
from slotwise.platforms import current_platform

_allocations = 0


def kv_cache_allocations() -> int:
    """How many times ``allocate_kv_caches`` gave layers new caches in this process:
    whoever keeps something made over a cache (a bound plan, views of it) drops it
    when this changes, rather than keep the old cache's memory alive."""
    return _allocations


def allocate_kv_caches(
    model: torch.nn.Module,
    num_blocks: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Give every ``Attention`` layer in ``model`` a zeroed cache of ``num_blocks`` blocks.

    Each layer's shape comes from its backend and its own block size; ``device``
    defaults to the current platform's, ``dtype`` to the layer's.  Returns the caches
    by layer name.
    """
    device = torch.device(device or current_platform.device_type)
    layers = [layer for layer in model.modules() if isinstance(layer, Attention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} contains no slotwise Attention layer")
    empty = [
        torch.empty(layer.kv_cache_shape(num_blocks), dtype=dtype or layer.dtype, device=device)
        for layer in layers
    ]
    if device.type == current_platform.device_type:
        # Before the first write, while the platform has no pages to move yet.
        current_platform.advise_resident_memory(empty)
    global _allocations
    _allocations += 1
    caches = {}
    for layer, cache in zip(layers, empty, strict=True):
        layer.kv_cache = cache.zero_()
        caches[layer.layer_name] = layer.kv_cache
    return caches
