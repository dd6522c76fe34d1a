"""``AttentionImpl``: the code that runs attention for one layer, one step at a time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from slotwise.attention.layer import Attention
    from slotwise.attention.metadata import AttentionMetadata


class AttentionImpl:
    """One instance per ``Attention`` layer, built by the layer from its backend."""

    def __init__(
        self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None
    ) -> None:
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        #: Query heads sharing one key/value head (grouped-query attention).
        self.num_queries_per_kv = num_heads // num_kv_heads

    def forward(
        self,
        layer: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """Write k/v into ``kv_cache`` at ``metadata.slot_mapping``, then attention into output.

        q and output are [num_tokens, num_heads, head_size], k and v
        [num_tokens, num_kv_heads, head_size]; only the first
        ``metadata.num_actual_tokens`` rows are real (the rest pad to a static-graph
        size).  ``output`` is allocated by the layer; write the result into it in place
        and return None.  ``kv_cache`` has the backend's ``get_kv_cache_shape``.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must implement forward()")

    def bind(
        self,
        layer: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        output: torch.Tensor,
    ) -> Callable[[], None]:
        """``forward`` on these arguments as one call without arguments, for a caller
        that makes it again step after step (a recorded decode step): with the same
        tensors, cache and metadata object, whose tensors a runner rewrites in place
        between steps (``step_cache`` emptied, counts set anew).  The caller binds
        again when any of those is another object.  A backend that binds its work to
        the tensors (``AttentionMetadata.layout_cache``) returns that work here;
        by default, ``forward`` with these arguments."""
        return functools.partial(self.forward, layer, q, k, v, kv_cache, metadata, output)
