"""The oracle of every attention check: attention written plainly, in float64.

``causal_attention`` is the math of one request, dense and unpaged.
``ReferenceAttention`` adds the paging around it: it keeps its own KV cache in the
documented layout ``[2, num_blocks, block_size, num_kv_heads, head_size]``, stores
each step's keys and values at the slot mapping and gathers a request's keys and
values through its block table.  It reads only the core ``AttentionMetadata`` fields
built by the core ``AttentionMetadataBuilder``, so it checks a backend whatever the
layout of the backend's own cache and whatever extra fields the backend's metadata
builder adds.
"""

from __future__ import annotations

import torch

from slotwise.attention import AttentionMetadata


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of one request, on the CPU in float64.

    q is [query_len, num_heads, head_size]: the request's last ``query_len`` tokens.
    keys/values are [seq_len, num_kv_heads, head_size]: all its tokens, cached and new.
    Query head h reads key/value head h // (num_heads // num_kv_heads).
    Returns [query_len, num_heads, head_size].
    """
    query_len, num_heads, head_size = q.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    # Query token i sits at position seq_len - query_len + i.
    positions = torch.arange(seq_len - query_len, seq_len)
    future = torch.arange(seq_len)[None, :] > positions[:, None]
    out = torch.empty(query_len, num_heads, head_size, dtype=torch.float64)
    for h in range(num_heads):
        k = keys[:, h // group].double().cpu()
        v = values[:, h // group].double().cpu()
        scores = (q[:, h].double().cpu() @ k.T) * scale
        out[:, h] = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
    return out


class ReferenceAttention:
    """One attention layer's reference: feed it every step the backend runs, in order."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        scale: float,
        *,
        num_blocks: int,
        block_size: int,
    ) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}): "
                "each key/value head serves the same number of consecutive query heads"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.block_size = block_size
        self.kv_cache = torch.zeros(
            2, num_blocks, block_size, num_kv_heads, head_size, dtype=torch.float64
        )

    def step(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Store this step's ``k``/``v`` and return the attention of ``q``.

        q is [num_tokens, num_heads, head_size], k and v [num_tokens, num_kv_heads,
        head_size], ordered as the metadata says; only the first
        ``metadata.num_actual_tokens`` rows are read.  Returns
        [num_actual_tokens, num_heads, head_size] in float64.
        """
        num_tokens = metadata.num_actual_tokens
        slots = metadata.slot_mapping[:num_tokens].cpu()
        # Slot s is block s // block_size, offset s % block_size: row s of the flat cache.
        self.kv_cache[0].flatten(0, 1)[slots] = k[:num_tokens].double().cpu()
        self.kv_cache[1].flatten(0, 1)[slots] = v[:num_tokens].double().cpu()
        out = torch.empty(num_tokens, self.num_heads, q.shape[-1], dtype=torch.float64)
        for r in range(metadata.num_reqs):
            start = int(metadata.query_start_loc[r])
            end = int(metadata.query_start_loc[r + 1])
            keys, values = self._gather(metadata.block_table[r], int(metadata.seq_lens[r]))
            out[start:end] = causal_attention(q[start:end], keys, values, self.scale)
        return out

    def _gather(self, block_row: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's first ``seq_len`` keys and values, in position order."""
        num_blocks = -(-seq_len // self.block_size)
        blocks = [int(b) for b in block_row[:num_blocks]]
        keys = torch.cat([self.kv_cache[0, b] for b in blocks])[:seq_len]
        values = torch.cat([self.kv_cache[1, b] for b in blocks])[:seq_len]
        return keys, values
