"""``torch.ops.slotwise.unified_attention_with_output``: attention as one opaque custom op.

Registered when ``slotwise.attention`` is imported.  Dynamo records the op as a
single node (its fake implementation does nothing: ``out`` is the only tensor it
changes and already has the right shape), and piecewise compilation splits the
graph there, so the op runs eagerly between compiled pieces and may read per-step
state that is not a graph input: the layer by name, the metadata from the forward
context.

The op is defined with ``torch.library.Library`` and its kernel registered for every
device at once (``CompositeExplicitAutograd``), not with ``torch.library.custom_op``:
the latter's Python wrappers cost about 12 µs a call in inference mode, paid by every
attention layer of every step, where the plain registration costs about 2.

Between the pieces of a split graph even that is avoided: the split graph calls the
layer's ``LayerAttention`` directly (``call_attention_directly`` in
``slotwise.compilation.splitting.fx_split``), the object the op's kernel calls too, so
both paths behave alike by construction.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.profiler

from slotwise.attention.kv_cache_reads import note_kv_cache_read
from slotwise.attention.layer import Attention, get_attention_layer
from slotwise.forward_context import get_forward_context

#: The op's qualified name, as listed in ``CompilationConfig.splitting_ops``.
UNIFIED_ATTENTION_OP = "slotwise::unified_attention_with_output"

_library = torch.library.Library("slotwise", "FRAGMENT")
_library.define(
    "unified_attention_with_output(Tensor q, Tensor k, Tensor v, Tensor(a!) out, "
    "str layer_name) -> ()"
)


def _no_layer() -> None:
    return None


class LayerAttention:
    """The attention of the layer named ``layer_name`` as a plain call, ``(q, k, v, out)``.

    What the op's kernel runs, and what a split graph calls in place of the op (through
    the dispatcher a call costs about 2 µs more, once per layer and step).  The layer is
    found by name on the first call with metadata and then held weakly: a freed model's
    layer is never kept alive, and a model built after it under the same names (see
    ``unused_layer_prefix``) is found again by name.  Pickled by name, so graphs holding
    one stay cacheable.
    """

    def __init__(self, layer_name: str) -> None:
        self.layer_name = layer_name
        #: The name FX gives the call in generated code.
        self.__name__ = "attention_" + re.sub(r"\W", "_", layer_name)
        #: The layer, weakly; unbound until the first call with metadata.
        self._layer: Callable[[], Attention | None] = _no_layer

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor
    ) -> None:
        """The op called as ``op(q, k, v, out, layer_name)``; under the profiler, shown as
        a range with the op's name."""
        if torch.autograd.profiler._is_profiler_enabled:
            with torch.autograd.profiler.record_function(UNIFIED_ATTENTION_OP):
                self.run(q, k, v, out)
        else:
            self.run(q, k, v, out)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
        """Attention into ``out``, writing k/v into the layer's KV cache.

        With no attention metadata (profiling and warm-up runs) ``out`` is zero-filled
        and the cache is left alone.
        """
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict):
            metadata = self._metadata(metadata)
        if metadata is None:
            out.zero_()
            return
        layer = self._layer()
        if layer is None or layer.kv_cache is None:
            layer, _ = self._layer_and_cache()
        note_kv_cache_read(layer, layer.kv_cache)
        layer.impl.forward(layer, q, k, v, layer.kv_cache, metadata, out)
        if metadata.num_actual_tokens < out.shape[0]:
            # Padding rows (static-graph sizes) get zeros rather than stale memory.
            out[metadata.num_actual_tokens :].zero_()

    def bind(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, metadata: Any
    ) -> Callable[[], None]:
        """``run`` on these tensors under ``metadata`` (the forward context's
        ``attn_metadata``) as one call, bound by the layer's backend
        (``AttentionImpl.bind``): valid for as long as the tensors, the layer's KV cache
        and the metadata object are these ones, whatever their tensors hold."""
        metadata = self._metadata(metadata)
        if metadata is None:
            return out.zero_
        layer, kv_cache = self._layer_and_cache()
        call = layer.impl.bind(layer, q, k, v, kv_cache, metadata, out)
        if metadata.num_actual_tokens == out.shape[0]:
            return call
        padding = out[metadata.num_actual_tokens :]

        def call_and_clear_padding() -> None:
            call()
            padding.zero_()

        return call_and_clear_padding

    def _metadata(self, metadata: Any) -> Any:
        """This layer's metadata out of the forward context's ``attn_metadata``."""
        if isinstance(metadata, dict):
            if self.layer_name not in metadata:
                raise KeyError(
                    f"the forward context's attn_metadata has no entry for {self.layer_name!r}"
                )
            return metadata[self.layer_name]
        return metadata

    def _layer_and_cache(self) -> tuple[Attention, torch.Tensor]:
        layer = self._layer()
        if layer is None:
            layer = get_attention_layer(self.layer_name)
            self._layer = weakref.ref(layer)
        kv_cache = layer.kv_cache
        if kv_cache is None:
            raise RuntimeError(
                f"Attention layer {self.layer_name!r} has no KV cache; call "
                "slotwise.attention.allocate_kv_caches(model, num_blocks) first"
            )
        return layer, kv_cache

    def __reduce__(self) -> tuple[Any, ...]:
        return layer_attention, (self.layer_name,)

    def __repr__(self) -> str:
        return f"LayerAttention({self.layer_name!r})"


_by_name: dict[str, LayerAttention] = {}


def layer_attention(layer_name: str) -> LayerAttention:
    """The one ``LayerAttention`` of ``layer_name`` in this process."""
    call = _by_name.get(layer_name)
    if call is None:
        call = _by_name[layer_name] = LayerAttention(layer_name)
    return call


def unified_attention_with_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_name: str
) -> None:
    """Attention of layer ``layer_name`` into ``out``, writing k/v into its KV cache.

    With no attention metadata (profiling and warm-up runs) ``out`` is zero-filled
    and the cache is left alone.
    """
    layer_attention(layer_name).run(q, k, v, out)


_library.impl(
    "unified_attention_with_output", unified_attention_with_output, "CompositeExplicitAutograd"
)


@torch.library.register_fake(UNIFIED_ATTENTION_OP)
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_name: str
) -> None:
    return None
