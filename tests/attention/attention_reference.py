"""The oracle for every attention backend: dense, unpaged, float64, one head at a time.

It knows nothing about blocks, slots or batching, so a backend that agrees with it
has its paging right as well as its math.
"""

from __future__ import annotations

import torch


def reference_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of one request.

    q is [query_len, num_heads, head_size]: the request's last ``query_len`` tokens.
    keys/values are [seq_len, num_kv_heads, head_size]: all its tokens, cached and new.
    Query head h reads key/value head h // (num_heads // num_kv_heads).
    Returns [query_len, num_heads, head_size] in float64.
    """
    query_len, num_heads, head_size = q.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    positions = torch.arange(seq_len - query_len, seq_len)
    future = torch.arange(seq_len)[None, :] > positions[:, None]
    out = torch.empty(query_len, num_heads, head_size, dtype=torch.float64)
    for h in range(num_heads):
        k = keys[:, h // group].double().cpu()
        v = values[:, h // group].double().cpu()
        scores = (q[:, h].double().cpu() @ k.T) * scale
        out[:, h] = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
    return out
