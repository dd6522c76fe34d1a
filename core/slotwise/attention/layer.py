"""The ``Attention`` layer: what model code calls, and the registry the op finds it in.

The layer's forward is a single call to ``torch.ops.slotwise.unified_attention_with_output``
with the layer's name.  The op is opaque to the compiler (a splitting op), so the
KV cache and the per-step metadata stay out of the traced graph: the op finds the
layer by name here and the metadata in the forward context.
"""

from __future__ import annotations

import gc
import weakref

import torch

from slotwise.attention.backend import AttentionBackend
from slotwise.attention.impl import AttentionImpl
from slotwise.attention.selector import select_attention_backend
from slotwise.platforms import get_current_platform

_layers: weakref.WeakValueDictionary[str, Attention] = weakref.WeakValueDictionary()


def get_attention_layer(name: str) -> Attention:
    """The live ``Attention`` layer constructed with ``prefix=name``."""
    try:
        return _layers[name]
    except KeyError:
        known = ", ".join(sorted(_layers)) or "none"
        raise KeyError(f"no live Attention layer named {name!r}; known layers: {known}") from None


def unused_layer_prefix(stem: str) -> str:
    """``stem`` with the lowest number (from 0) that no live layer's name starts with.

    Why reuse numbers: a model's attention calls name their layers, and where a platform
    compiles the model as one graph (the CPU) those names are constants of the compiled
    graph and so of its cache key.  A model built after the previous one was freed gets
    the names a fresh process would give it, and with them the compile cache's entries.
    Compiled models are freed in reference cycles, so garbage is collected once when the
    first name is taken.
    """

    def taken() -> set[str]:
        return {name.split(".", 1)[0] for name in list(_layers.keys())}

    names = taken()
    if f"{stem}0" in names:
        gc.collect()
        names = taken()
    number = 0
    while f"{stem}{number}" in names:
        number += 1
    return f"{stem}{number}"


class Attention(torch.nn.Module):
    """Paged attention over this layer's ``kv_cache`` with the selected backend.

    ``prefix`` is the layer's process-wide unique name (e.g. "model.layers.3.attn").
    Without ``backend`` the current platform picks one for ``head_size``, ``dtype``
    (default: torch's default dtype) and ``block_size``.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        *,
        prefix: str,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        backend: type[AttentionBackend] | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.block_size = block_size
        self.dtype = dtype or torch.get_default_dtype()
        self.layer_name = prefix
        if backend is None:
            backend = select_attention_backend(
                get_current_platform(), head_size=head_size, dtype=self.dtype, block_size=block_size
            )
        self.attn_backend = backend
        self.impl: AttentionImpl = backend.get_impl_cls()(
            num_heads, head_size, scale, self.num_kv_heads
        )
        #: Set by ``allocate_kv_caches`` (or by hand) before the first step with metadata.
        self.kv_cache: torch.Tensor | None = None
        _register(self)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return self.attn_backend.get_kv_cache_shape(
            num_blocks, self.block_size, self.num_kv_heads, self.head_size
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [num_tokens, num_heads * head_size], k/v [num_tokens, num_kv_heads * head_size]
        (or already split into heads) -> [num_tokens, num_heads * head_size]."""
        num_tokens = q.shape[0]
        q = q.reshape(num_tokens, self.num_heads, self.head_size)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_size)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_size)
        out = torch.empty_like(q)
        torch.ops.slotwise.unified_attention_with_output(q, k, v, out, self.layer_name)
        return out.view(num_tokens, self.num_heads * self.head_size)

    def extra_repr(self) -> str:
        return (
            f"name={self.layer_name!r}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_size={self.head_size}, "
            f"backend={self.attn_backend.get_name()}"
        )


def _register(layer: Attention) -> None:
    # A live duplicate would make the op read and write the other layer's cache.
    existing = _layers.get(layer.layer_name)
    if existing is not None:
        raise ValueError(
            f"an Attention layer named {layer.layer_name!r} already exists; give each layer "
            "a unique prefix (e.g. its module path), or delete the old model first"
        )
    _layers[layer.layer_name] = layer
