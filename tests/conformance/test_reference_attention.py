"""The conformance oracle itself: paged, step by step, it equals torch's attention.

``ReferenceAttention`` judges every vendor's attention backend, so it is checked
here against torch's scaled_dot_product_attention over the whole sequences (with
the lower-right causal bias torch provides for queries that follow a cached
context), with the layer's own scale and grouped-query attention, the cache filled
over two steps through shuffled, non-contiguous blocks.  The inputs are chosen so
that the mistakes the conformance check must catch (the default scale, key/value
heads expanded with ``repeat``, a causal mask aligned top-left) change the answer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from slotwise.attention import AttentionMetadataBuilder
from slotwise.testing.conformance.reference_attention import ReferenceAttention, causal_attention

BLOCK_SIZE = 4
NUM_KV_HEADS, HEAD_SIZE = 2, 8
#: (context_len, query_len) per request; decodes first, as the metadata requires.  Decodes
#: after no context and after whole blocks; prefixes ending on a block boundary; queries
#: shorter and longer than a block.
REQUESTS = [(5, 1), (0, 1), (8, 1), (0, 7), (9, 4), (8, 6), (12, 9)]
#: Query heads per key/value head: none shared, powers of two and one that is not.
GROUPS = (1, 2, 3, 4, 8)
#: Neither is SDPA's default, 1/sqrt(HEAD_SIZE).
SCALES = (0.3, 0.75 * HEAD_SIZE**-0.5)


def sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """torch's attention of one request whose queries are its last tokens, with each
    key/value head expanded to its consecutive query heads; ``[tokens, heads, D]`` layout."""
    group = q.shape[1] // keys.shape[1]
    out = F.scaled_dot_product_attention(
        q.double().transpose(0, 1),
        keys.double().repeat_interleave(group, dim=1).transpose(0, 1),
        values.double().repeat_interleave(group, dim=1).transpose(0, 1),
        attn_mask=causal_lower_right(q.shape[0], keys.shape[0]),
        scale=scale,
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("group", GROUPS)
def test_reference_equals_sdpa_over_the_whole_sequences(group: int, scale: float):
    num_heads = NUM_KV_HEADS * group
    generator = torch.Generator().manual_seed(group)
    seq_lens = [c + q for c, q in REQUESTS]
    keys = [torch.randn(n, NUM_KV_HEADS, HEAD_SIZE, generator=generator) for n in seq_lens]
    values = [torch.randn(n, NUM_KV_HEADS, HEAD_SIZE, generator=generator) for n in seq_lens]
    queries = [torch.randn(q, num_heads, HEAD_SIZE, generator=generator) for _, q in REQUESTS]
    needed = [-(-n // BLOCK_SIZE) for n in seq_lens]
    order = torch.randperm(sum(needed) + 2, generator=generator).tolist()
    blocks = [order[sum(needed[:r]) : sum(needed[: r + 1])] for r in range(len(REQUESTS))]
    reference = ReferenceAttention(
        num_heads, NUM_KV_HEADS, HEAD_SIZE, scale, num_blocks=len(order), block_size=BLOCK_SIZE
    )
    builder = AttentionMetadataBuilder(BLOCK_SIZE)

    # Step 1: the cached contexts, as prefills (queries are irrelevant to step 2).
    cached = [r for r, (c, _) in enumerate(REQUESTS) if c]
    step1 = builder.build(
        [REQUESTS[r][0] for r in cached], [0] * len(cached), [blocks[r] for r in cached]
    )
    k1 = torch.cat([keys[r][: REQUESTS[r][0]] for r in cached])
    v1 = torch.cat([values[r][: REQUESTS[r][0]] for r in cached])
    reference.step(torch.zeros(len(k1), num_heads, HEAD_SIZE), k1, v1, step1)

    # Step 2: every request's new tokens.
    step2 = builder.build([q for _, q in REQUESTS], [c for c, _ in REQUESTS], blocks)
    got = reference.step(
        torch.cat(queries),
        torch.cat([k[c:] for k, (c, _) in zip(keys, REQUESTS, strict=True)]),
        torch.cat([v[c:] for v, (c, _) in zip(values, REQUESTS, strict=True)]),
        step2,
    )

    expected = [sdpa(q, k, v, scale) for q, k, v in zip(queries, keys, values, strict=True)]
    torch.testing.assert_close(got, torch.cat(expected))


@pytest.mark.parametrize("group", GROUPS)
def test_causal_attention_equals_sdpa_with_gqa_and_tells_the_common_mistakes_apart(group: int):
    num_heads = NUM_KV_HEADS * group
    generator = torch.Generator().manual_seed(100 + group)
    context_len, query_len = 11, 6
    q = torch.randn(query_len, num_heads, HEAD_SIZE, generator=generator)
    keys = torch.randn(context_len + query_len, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    values = torch.randn(context_len + query_len, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
    scale = SCALES[1]

    got = causal_attention(q, keys, values, scale)

    torch.testing.assert_close(got, sdpa(q, keys, values, scale))
    # SDPA's own grouped-query expansion, with the causal mask written out.
    mask = torch.ones(query_len, context_len + query_len, dtype=torch.bool).tril(context_len)
    native = F.scaled_dot_product_attention(
        *(x.double().transpose(0, 1) for x in (q, keys, values)),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    torch.testing.assert_close(got, native.transpose(0, 1))

    def differs(other: torch.Tensor) -> bool:
        return bool((got - other).abs().max() > 1e-2)

    assert differs(sdpa(q, keys, values, scale=None)), "the default scale gives the same"
    top_left = F.scaled_dot_product_attention(
        q.double().transpose(0, 1),
        *(x.double().repeat_interleave(group, dim=1).transpose(0, 1) for x in (keys, values)),
        is_causal=True,
        scale=scale,
    )
    assert differs(top_left.transpose(0, 1)), "a top-left causal mask gives the same"
    if group > 1:
        tiled = F.scaled_dot_product_attention(
            q.double().transpose(0, 1),
            *(x.double().repeat(1, group, 1).transpose(0, 1) for x in (keys, values)),
            attn_mask=mask,
            scale=scale,
        )
        assert differs(tiled.transpose(0, 1)), "expanding with repeat gives the same"


def test_reference_refuses_query_heads_that_key_value_heads_cannot_share_evenly():
    with pytest.raises(
        ValueError, match=r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"
    ):
        ReferenceAttention(6, 4, HEAD_SIZE, 0.3, num_blocks=2, block_size=BLOCK_SIZE)
