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
"""

from __future__ import annotations

import torch

from slotwise.attention.layer import get_attention_layer
from slotwise.forward_context import get_forward_context

#: The op's qualified name, as listed in ``CompilationConfig.splitting_ops``.
UNIFIED_ATTENTION_OP = "slotwise::unified_attention_with_output"

_library = torch.library.Library("slotwise", "FRAGMENT")
_library.define(
    "unified_attention_with_output(Tensor q, Tensor k, Tensor v, Tensor(a!) out, "
    "str layer_name) -> ()"
)


def unified_attention_with_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_name: str
) -> None:
    """Attention of layer ``layer_name`` into ``out``, writing k/v into its KV cache.

    With no attention metadata (profiling and warm-up runs) ``out`` is zero-filled
    and the cache is left alone.
    """
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, dict):
        if layer_name not in metadata:
            raise KeyError(f"the forward context's attn_metadata has no entry for {layer_name!r}")
        metadata = metadata[layer_name]
    if metadata is None:
        out.zero_()
        return
    layer = get_attention_layer(layer_name)
    if layer.kv_cache is None:
        raise RuntimeError(
            f"Attention layer {layer_name!r} has no KV cache; call "
            "slotwise.attention.allocate_kv_caches(model, num_blocks) first"
        )
    layer.impl.forward(layer, q, k, v, layer.kv_cache, metadata, out)
    if metadata.num_actual_tokens < out.shape[0]:
        # Padding rows (static-graph sizes) get zeros rather than stale memory.
        out[metadata.num_actual_tokens :].zero_()


_library.impl(
    "unified_attention_with_output", unified_attention_with_output, "CompositeExplicitAutograd"
)


@torch.library.register_fake(UNIFIED_ATTENTION_OP)
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_name: str
) -> None:
    return None
