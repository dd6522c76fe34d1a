"""CPU_SDPA's facts: head-major cache blocks (for the C kernel), its dtypes, and the
error naming slots outside the cache.  Its per-step plans, shared by a step's layers,
are held to the reference by the conformance kit's shared-step case."""

from __future__ import annotations

import pytest
import torch

from slotwise.attention import Attention, AttentionMetadataBuilder, allocate_kv_caches
from slotwise.attention.layer import unused_layer_prefix
from slotwise.forward_context import set_forward_context
from slotwise_cpu.attention import CpuSdpaBackend

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 16
BLOCK_SIZE, LAYERS = 4, 3


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
