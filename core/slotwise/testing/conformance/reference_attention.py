"""The oracle of every attention check: attention written plainly, in float64.

``causal_attention`` is one request, dense; ``ReferenceAttention`` adds the paging, with
its own KV cache in the documented layout, reading only the core ``AttentionMetadata``
fields, so it checks a backend whatever its own cache layout and metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slotwise.attention import AttentionMetadata


@dataclass
class AttentionTerms:
    """The float64 attention of some query tokens, and the sizes of its reductions.

    Every tensor is [tokens, num_heads, head_size] or broadcasts to it:
    ``weighted_rms`` is sqrt(sum_j p_j^2 v_j^2), ``weighted_abs`` sum_j p_j |v_j|,
    ``score_magnitude`` the row's largest scale x sum_d |q_d k_jd| and ``seq_lens``
    the number of keys each token's row reduces.
    """

    out: torch.Tensor
    weighted_rms: torch.Tensor
    weighted_abs: torch.Tensor
    score_magnitude: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def concatenate(cls, parts: list[AttentionTerms]) -> AttentionTerms:
        return cls(*(torch.cat([getattr(p, name) for p in parts]) for name in _TERM_FIELDS))


_TERM_FIELDS = ("out", "weighted_rms", "weighted_abs", "score_magnitude", "seq_lens")


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of one request, on the CPU in float64.

    q is [query_len, num_heads, head_size]: the request's last ``query_len`` tokens.
    keys/values are [seq_len, num_kv_heads, head_size]: all its tokens, cached and new.
    Query head h reads key/value head h // (num_heads // num_kv_heads).
    Returns [query_len, num_heads, head_size].
    """
    return causal_attention_terms(q, keys, values, scale).out


def causal_attention_terms(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> AttentionTerms:
    """``causal_attention`` with the magnitudes of its reductions (see ``AttentionTerms``)."""
    query_len, num_heads, head_size = q.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    # Query token i sits at position seq_len - query_len + i.
    positions = torch.arange(seq_len - query_len, seq_len)
    future = torch.arange(seq_len)[None, :] > positions[:, None]
    shape = (query_len, num_heads, head_size)
    out, rms, weighted_abs = (torch.empty(shape, dtype=torch.float64) for _ in range(3))
    score_magnitude = torch.empty(query_len, num_heads, 1, dtype=torch.float64)
    for h in range(num_heads):
        k = keys[:, h // group].double().cpu()
        v = values[:, h // group].double().cpu()
        query = q[:, h].double().cpu()
        scores = (query @ k.T) * scale
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        out[:, h] = probs @ v
        rms[:, h] = (probs.square() @ v.square()).sqrt()
        weighted_abs[:, h] = probs @ v.abs()
        magnitudes = (query.abs() @ k.abs().T) * abs(scale)
        score_magnitude[:, h, 0] = magnitudes.masked_fill(future, 0.0).amax(dim=-1)
    seq_lens = torch.full((query_len, 1, 1), seq_len, dtype=torch.float64)
    return AttentionTerms(out, rms, weighted_abs, score_magnitude, seq_lens)


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
        return self.step_terms(q, k, v, metadata).out

    def step_terms(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata
    ) -> AttentionTerms:
        """``step``, with the magnitudes its error bound is derived from."""
        self.store(k, v, metadata)
        parts = []
        for r in range(metadata.num_reqs):
            start = int(metadata.query_start_loc[r])
            end = int(metadata.query_start_loc[r + 1])
            keys, values = self._gather(metadata.block_table[r], int(metadata.seq_lens[r]))
            parts.append(causal_attention_terms(q[start:end], keys, values, self.scale))
        return AttentionTerms.concatenate(parts)

    def store(self, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> None:
        """Store a step's keys and values at its slots, without computing its attention
        (for the steps that only fill a long context)."""
        num_tokens = metadata.num_actual_tokens
        slots = metadata.slot_mapping[:num_tokens].cpu()
        # Slot s is block s // block_size, offset s % block_size: row s of the flat cache.
        self.kv_cache[0].flatten(0, 1)[slots] = k[:num_tokens].double().cpu()
        self.kv_cache[1].flatten(0, 1)[slots] = v[:num_tokens].double().cpu()

    def _gather(self, block_row: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's first ``seq_len`` keys and values, in position order."""
        num_blocks = -(-seq_len // self.block_size)
        blocks = [int(b) for b in block_row[:num_blocks]]
        keys = torch.cat([self.kv_cache[0, b] for b in blocks])[:seq_len]
        values = torch.cat([self.kv_cache[1, b] for b in blocks])[:seq_len]
        return keys, values
