"""Small models of slotwise Attention layers that the attention tests share."""

from __future__ import annotations

import torch

from slotwise.attention import Attention
from slotwise.attention.layer import unused_layer_prefix

HEADS, KV_HEADS, HEAD_SIZE, HIDDEN = 4, 2, 16, 32


def attention_layers(
    backend: type, count: int, *, block_size: int, prefix: str | None = None
) -> torch.nn.ModuleList:
    """``count`` layers of ``HEADS`` query and ``KV_HEADS`` key/value heads of
    ``HEAD_SIZE``, named ``<prefix>.<i>`` (by default a prefix no live layer has)."""
    prefix = prefix or unused_layer_prefix("attention_test")
    return torch.nn.ModuleList(
        Attention(
            HEADS,
            HEAD_SIZE,
            HEAD_SIZE**-0.5,
            KV_HEADS,
            prefix=f"{prefix}.{i}",
            block_size=block_size,
            backend=backend,
        )
        for i in range(count)
    )


class TwoLayers(torch.nn.Module):
    """A fused qkv projection feeding two attention layers, with work between them, as a
    model would."""

    def __init__(self, backend: type, *, block_size: int, prefix: str | None = None) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_SIZE)
        self.attn = attention_layers(backend, 2, block_size=block_size, prefix=prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attn in self.attn:
            q, k, v = self.qkv(x).split(
                [HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE], dim=-1
            )
            x = torch.relu(x + attn(q, k, v)[:, :HIDDEN])
        return x
