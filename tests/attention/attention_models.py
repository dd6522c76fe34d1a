"""Small models of slotwise Attention layers that the attention tests share, and the
reference backends they run on: the core's own doubles, no plugin's."""

from __future__ import annotations

from typing import ClassVar

import torch

from slotwise.attention import Attention, AttentionBackend, AttentionImpl, AttentionMetadata
from slotwise.attention.layer import unused_layer_prefix
from slotwise.testing.conformance.reference_attention import causal_attention

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


class ReferenceImpl(AttentionImpl):
    """Writes a step's keys and values at its slots, then each request's causal attention
    by the float64 oracle: what the core asks of any backend, in the plainest code."""

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
        backend = layer.attn_backend
        # [2, blocks, block size, kv heads, D] whichever layout the backend keeps
        tokens = kv_cache.transpose(2, 3) if backend.head_major else kv_cache
        block_size = tokens.shape[2]
        num_tokens = metadata.num_actual_tokens
        slots = metadata.slot_mapping[:num_tokens]
        blocks, offsets = slots // block_size, slots % block_size
        tokens[0, blocks, offsets] = k[:num_tokens].to(tokens.dtype)
        tokens[1, blocks, offsets] = v[:num_tokens].to(tokens.dtype)
        for r in range(metadata.num_reqs):
            start, end = (int(i) for i in metadata.query_start_loc[r : r + 2])
            seq_len = int(metadata.seq_lens[r])
            row = metadata.block_table[r, : -(-seq_len // block_size)]
            keys = tokens[0, row].flatten(0, 1)[:seq_len]
            values = tokens[1, row].flatten(0, 1)[:seq_len]
            attended = causal_attention(q[start:end], keys, values, self.scale)
            output[start:end] = attended.to(output.dtype)


class ReferenceBackend(AttentionBackend):
    """A backend of the core's default cache layout, [2, blocks, block size, kv heads, D]."""

    head_major: ClassVar[bool] = False

    @classmethod
    def get_name(cls) -> str:
        return "TEST_REFERENCE"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return ReferenceImpl


class HeadMajorReferenceBackend(ReferenceBackend):
    """The same attention over head-major blocks, [2, blocks, kv heads, block size, D], as
    a backend whose kernel wants each head's tokens contiguous keeps them."""

    head_major = True

    @classmethod
    def get_name(cls) -> str:
        return "TEST_HEAD_MAJOR_REFERENCE"

    @classmethod
    def get_kv_cache_shape(
        cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        return (2, num_blocks, num_kv_heads, block_size, head_size)
