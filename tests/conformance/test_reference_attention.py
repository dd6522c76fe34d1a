"""The conformance oracle itself: paged, step by step, it equals dense causal attention.

``ReferenceAttention`` judges every vendor's attention backend, so it is checked
here against torch's scaled_dot_product_attention over the whole sequences, with
the cache filled over two steps through shuffled, non-contiguous blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slotwise.attention import AttentionMetadataBuilder
from slotwise.testing.conformance.reference_attention import ReferenceAttention

BLOCK_SIZE = 4
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 4, 2, 8
#: (context_len, query_len) per request; the decode first, as the metadata requires.
REQUESTS = [(5, 1), (0, 7), (9, 4)]


def test_reference_equals_dense_causal_attention_with_gqa():
    generator = torch.Generator().manual_seed(0)
    seq_lens = [c + q for c, q in REQUESTS]
    keys = [torch.randn(n, NUM_KV_HEADS, HEAD_SIZE, generator=generator) for n in seq_lens]
    values = [torch.randn(n, NUM_KV_HEADS, HEAD_SIZE, generator=generator) for n in seq_lens]
    queries = [torch.randn(q, NUM_HEADS, HEAD_SIZE, generator=generator) for _, q in REQUESTS]
    needed = [-(-n // BLOCK_SIZE) for n in seq_lens]
    order = torch.randperm(sum(needed) + 2, generator=generator).tolist()
    blocks = [order[sum(needed[:r]) : sum(needed[: r + 1])] for r in range(len(REQUESTS))]
    reference = ReferenceAttention(
        NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, 0.3, num_blocks=len(order), block_size=BLOCK_SIZE
    )
    builder = AttentionMetadataBuilder(BLOCK_SIZE)

    # Step 1: the cached contexts, as prefills (queries are irrelevant to step 2).
    cached = [r for r, (c, _) in enumerate(REQUESTS) if c]
    step1 = builder.build(
        [REQUESTS[r][0] for r in cached], [0] * len(cached), [blocks[r] for r in cached]
    )
    k1 = torch.cat([keys[r][: REQUESTS[r][0]] for r in cached])
    v1 = torch.cat([values[r][: REQUESTS[r][0]] for r in cached])
    reference.step(torch.zeros(len(k1), NUM_HEADS, HEAD_SIZE), k1, v1, step1)

    # Step 2: every request's new tokens.
    step2 = builder.build([q for _, q in REQUESTS], [c for c, _ in REQUESTS], blocks)
    got = reference.step(
        torch.cat(queries),
        torch.cat([k[c:] for k, (c, _) in zip(keys, REQUESTS, strict=True)]),
        torch.cat([v[c:] for v, (c, _) in zip(values, REQUESTS, strict=True)]),
        step2,
    )

    expected = []
    for (context, query_len), q, k, v in zip(REQUESTS, queries, keys, values, strict=True):
        mask = torch.ones(query_len, context + query_len, dtype=torch.bool).tril(context)
        out = F.scaled_dot_product_attention(
            q.double().transpose(0, 1),
            k.double().transpose(0, 1),
            v.double().transpose(0, 1),
            attn_mask=mask,
            scale=0.3,
            enable_gqa=True,
        )
        expected.append(out.transpose(0, 1))
    torch.testing.assert_close(got, torch.cat(expected))
