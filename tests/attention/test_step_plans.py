"""Per-step plans: what every layer of a step shares is worked out once, by its first layer.

``CPU_SDPA`` and the ascend stub's reference backend keep the step's host-side reading of
the metadata (slots, request rows and lengths, masks) in ``AttentionMetadata.step_cache``.
These tests run several layers, each with its own keys, values and cache, over the same
metadata object step after step, and check every layer against the dense reference: a
plan that held anything of the first layer would give the others its results.
"""

from __future__ import annotations

import pytest
import torch
from attention_models import HEAD_SIZE, HEADS, KV_HEADS, attention_layers

from slotwise.attention import AttentionMetadataBuilder, allocate_kv_caches
from slotwise.forward_context import set_forward_context
from slotwise.testing.conformance.reference_attention import causal_attention
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_cpu.attention import CpuSdpaBackend

BLOCK_SIZE, LAYERS = 4, 3

#: Query lengths per step of three requests (decodes first), each growing step to step.
STEPS = [[6, 3, 5], [1, 1, 1], [1, 5, 2], [1, 1, 1]]


def layers(backend: type) -> torch.nn.ModuleList:
    model = attention_layers(backend, LAYERS, block_size=BLOCK_SIZE)
    allocate_kv_caches(model, num_blocks=32)
    return model


@pytest.mark.parametrize("backend", [CpuSdpaBackend, AscendStubReferenceBackend])
def test_layers_sharing_a_step_plan_each_match_the_reference(backend):
    model = layers(backend)
    blocks = [list(range(8 * r, 8 * r + 8))[::-1] for r in range(3)]  # 32 tokens each
    history = [[([], []) for _ in range(3)] for _ in range(LAYERS)]  # layer, request: k, v
    cached = [0, 0, 0]
    for query_lens in STEPS:
        metadata = AttentionMetadataBuilder(BLOCK_SIZE).build(query_lens, cached, blocks)
        tokens = sum(query_lens)
        with set_forward_context(metadata):
            for layer, seen in zip(model, history, strict=True):
                q = torch.randn(tokens, HEADS * HEAD_SIZE)
                k, v = (
                    torch.randn(tokens, KV_HEADS, HEAD_SIZE),
                    torch.randn(tokens, KV_HEADS, HEAD_SIZE),
                )
                out = layer(q, k, v).view(tokens, HEADS, HEAD_SIZE)
                start = 0
                for r, query_len in enumerate(query_lens):
                    rows = slice(start, start + query_len)
                    seen[r][0].append(k[rows])
                    seen[r][1].append(v[rows])
                    expected = causal_attention(
                        q[rows].view(query_len, HEADS, HEAD_SIZE),
                        torch.cat(seen[r][0]),
                        torch.cat(seen[r][1]),
                        HEAD_SIZE**-0.5,
                    )
                    torch.testing.assert_close(out[rows].double(), expected, rtol=1e-4, atol=1e-4)
                    start += query_len
        cached = [c + q for c, q in zip(cached, query_lens, strict=True)]


def test_cpu_sdpa_names_slots_outside_the_cache():
    (layer, *_) = layers(CpuSdpaBackend)
    metadata = AttentionMetadataBuilder(BLOCK_SIZE).build([3], [0], [[40]])  # 32 blocks
    q = torch.randn(3, HEADS * HEAD_SIZE)
    k = v = torch.randn(3, KV_HEADS * HEAD_SIZE)
    with set_forward_context(metadata), pytest.raises(IndexError) as err:
        layer(q, k, v)
    assert str(err.value) == (
        "CPU_SDPA: slot_mapping holds slots 160 to 162, outside this cache's 0 to 127"
    )
