"""CPU_SDPA's facts and its per-step plans.

Its cache blocks are head-major, for the C kernel.  What every layer of a step shares
(slots, request rows and lengths, masks) is worked out once, by the step's first layer,
and kept in ``AttentionMetadata.step_cache``: several layers, each with its own keys,
values and cache, run over the same metadata object step after step and each must match
the dense reference, which a plan holding anything of the first layer would not.
"""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import Attention, AttentionMetadataBuilder, allocate_kv_caches
from slotwise.attention.layer import unused_layer_prefix
from slotwise.forward_context import set_forward_context
from slotwise.testing.conformance.reference_attention import causal_attention
from slotwise_cpu.attention import CpuSdpaBackend

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 16
BLOCK_SIZE, LAYERS = 4, 3

#: Query lengths per step of three requests (decodes first), each growing step to step.
STEPS = [[6, 3, 5], [1, 1, 1], [1, 5, 2], [1, 1, 1]]


def layers() -> torch.nn.ModuleList:
    prefix = unused_layer_prefix("cpu_sdpa_test")
    model = torch.nn.ModuleList(
        Attention(
            HEADS,
            HEAD_SIZE,
            HEAD_SIZE**-0.5,
            KV_HEADS,
            prefix=f"{prefix}.{i}",
            block_size=BLOCK_SIZE,
            backend=CpuSdpaBackend,
        )
        for i in range(LAYERS)
    )
    allocate_kv_caches(model, num_blocks=32)
    return model


def test_cpu_sdpa_declares_head_major_blocks_and_its_dtypes():
    assert CpuSdpaBackend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 2, 16, 64)
    assert CpuSdpaBackend.validate(head_size=128, dtype=torch.float16, block_size=16) == []
    assert CpuSdpaBackend.validate(dtype=torch.float64) == [
        f"dtype torch.float64 not in ({', '.join(map(str, CpuSdpaBackend.supported_dtypes))})"
    ]


def test_layers_sharing_a_cpu_sdpa_step_plan_each_match_the_reference():
    model = layers()
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
    (layer, *_) = layers()
    metadata = AttentionMetadataBuilder(BLOCK_SIZE).build([3], [0], [[40]])  # 32 blocks
    q = torch.randn(3, HEADS * HEAD_SIZE)
    k = v = torch.randn(3, KV_HEADS * HEAD_SIZE)
    with set_forward_context(metadata), pytest.raises(IndexError) as err:
        layer(q, k, v)
    assert str(err.value) == (
        "CPU_SDPA: slot_mapping holds slots 160 to 162, outside this cache's 0 to 127"
    )
