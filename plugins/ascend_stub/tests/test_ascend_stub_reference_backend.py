"""The ascend stub's reference backend: its facts and the graph mode it lets the
platform default to.  Its per-step plans, shared by a step's layers, are held to the
reference by the conformance kit's shared-step case."""

from __future__ import annotations

import torch

from slotwise.compilation import CompilationConfig, GraphMode
from slotwise.compilation.compiled_forward import prepare_config
from slotwise.compilation.static_graphs.graph_modes import default_graph_mode
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_ascend_stub.platform import AscendStubPlatform


def test_the_reference_backend_keeps_the_cores_cache_layout_and_its_dtypes():
    backend = AscendStubReferenceBackend
    assert backend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert backend.validate(head_size=128, dtype=torch.float16, block_size=16) == []
    assert backend.validate(dtype=torch.float64) == [
        f"dtype torch.float64 not in ({', '.join(map(str, backend.supported_dtypes))})"
    ]


def test_ascend_stub_defaults_to_full_and_piecewise_for_its_reference_backend():
    platform = AscendStubPlatform()
    choice = default_graph_mode(platform)
    assert choice.mode == GraphMode.FULL_AND_PIECEWISE
    assert "attention backend ASCEND_STUB_REFERENCE (UNIFORM_DECODE) may be captured" in (
        choice.reason
    )
    assert prepare_config(CompilationConfig(level=3), platform).graph_mode == (
        GraphMode.FULL_AND_PIECEWISE
    )
