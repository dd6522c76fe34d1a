"""TRITON_PAGED's facts, which selection and the graph modes read without running a
kernel (its numbers: test_triton_attention.py and the core's cross-backend test)."""

from __future__ import annotations

import torch

from slotwise_cuda.attention import TritonPagedBackend


def test_triton_paged_keeps_the_cores_cache_layout_and_its_dtypes():
    assert TritonPagedBackend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert TritonPagedBackend.validate(head_size=128, dtype=torch.float16, block_size=16) == []
    assert TritonPagedBackend.validate(dtype=torch.float64) == [
        f"dtype torch.float64 not in ({', '.join(map(str, TritonPagedBackend.supported_dtypes))})"
    ]
