"""``ASCEND_STUB_REFERENCE``: paged attention written to be read, not to be fast.

A vendor porting slotwise starts here: this is everything an attention backend has
to do, one sequence at a time, in plain torch.  Replace the body of ``forward``
with calls to your kernels and keep the tests in tests/attention passing.

The cache of one layer is ``kv_cache[2, num_blocks, block_size, num_kv_heads,
head_size]`` (0: keys, 1: values).  The batch is ``[decodes..., prefills...]``, but
this implementation does not need to care: a decode is a prefill of one token.
"""

from __future__ import annotations

import torch

from slotwise.attention import (
    Attention,
    AttentionBackend,
    AttentionImpl,
    AttentionMetadata,
    GraphSupport,
)


class AscendStubReferenceBackend(AttentionBackend):
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    # Python loops over requests read the metadata on the host: never inside a graph.
    graph_support = GraphSupport.PIECEWISE_ONLY

    @classmethod
    def get_name(cls) -> str:
        return "ASCEND_STUB_REFERENCE"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return AscendStubReferenceImpl


class AscendStubReferenceImpl(AttentionImpl):
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
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        block_size = key_cache.shape[1]

        # Step 1: store this step's keys and values.  Token t goes to slot
        # slot_mapping[t], i.e. block slot // block_size, offset slot % block_size.
        for t in range(metadata.num_actual_tokens):
            slot = int(metadata.slot_mapping[t])
            key_cache[slot // block_size, slot % block_size] = k[t]
            value_cache[slot // block_size, slot % block_size] = v[t]

        # Step 2: attention, one request (sequence) at a time.
        for r in range(metadata.num_reqs):
            # This request's query tokens are rows start..end-1 of q and output.
            start = int(metadata.query_start_loc[r])
            end = int(metadata.query_start_loc[r + 1])
            seq_len = int(metadata.seq_lens[r])  # tokens in the cache, new ones included
            context_len = seq_len - (end - start)  # tokens cached before this step

            # 2a: gather the request's keys and values from its blocks, in order.
            num_blocks = (seq_len + block_size - 1) // block_size
            block_ids = metadata.block_table[r, :num_blocks].tolist()
            keys = torch.cat([key_cache[b] for b in block_ids])[:seq_len]
            values = torch.cat([value_cache[b] for b in block_ids])[:seq_len]

            # 2b: grouped-query attention: each key/value head serves
            # num_queries_per_kv consecutive query heads.
            keys = keys.repeat_interleave(self.num_queries_per_kv, dim=1)  # [seq, heads, D]
            values = values.repeat_interleave(self.num_queries_per_kv, dim=1)

            # 2c: scores[h, i, j] = scale * q_i . k_j, in float32 for accuracy.
            query = q[start:end].float()  # [query_len, heads, D]
            scores = torch.einsum("ihd,jhd->hij", query, keys.float()) * self.scale

            # 2d: causal mask: query token i sits at position context_len + i and
            # may only look at keys at positions <= its own.
            query_pos = torch.arange(context_len, seq_len)[:, None]
            key_pos = torch.arange(seq_len)[None, :]
            scores = scores.masked_fill(key_pos > query_pos, float("-inf"))

            # 2e: softmax over the keys, then the weighted sum of the values.
            probs = scores.softmax(dim=-1)
            out = torch.einsum("hij,jhd->ihd", probs, values.float())
            output[start:end] = out.to(output.dtype)
