"""The ascend stub's reference backend: its facts, its per-step plans and the graph mode
it lets the platform default to.

What every layer of a step shares (slots, request rows and lengths, masks) is worked out
once, by the step's first layer, and kept in ``AttentionMetadata.step_cache``: several
layers, each with its own keys, values and cache, run over the same metadata object step
after step and each must match the dense reference, which a plan holding anything of the
first layer would not.
"""

from __future__ import annotations

import torch

from slotwise.attention import Attention, AttentionMetadataBuilder, allocate_kv_caches
from slotwise.attention.layer import unused_layer_prefix
from slotwise.compilation import CompilationConfig, GraphMode
from slotwise.compilation.compiled_forward import prepare_config
from slotwise.compilation.static_graphs.graph_modes import default_graph_mode
from slotwise.forward_context import set_forward_context
from slotwise.testing.conformance.reference_attention import causal_attention
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_ascend_stub.platform import AscendStubPlatform

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 16
BLOCK_SIZE, LAYERS = 4, 3

#: Query lengths per step of three requests (decodes first), each growing step to step.
STEPS = [[6, 3, 5], [1, 1, 1], [1, 5, 2], [1, 1, 1]]


def layers() -> torch.nn.ModuleList:
    prefix = unused_layer_prefix("ascend_stub_reference_test")
    model = torch.nn.ModuleList(
        Attention(
            HEADS,
            HEAD_SIZE,
            HEAD_SIZE**-0.5,
            KV_HEADS,
            prefix=f"{prefix}.{i}",
            block_size=BLOCK_SIZE,
            backend=AscendStubReferenceBackend,
        )
        for i in range(LAYERS)
    )
    allocate_kv_caches(model, num_blocks=32)
    return model


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


def test_layers_sharing_an_ascend_stub_step_plan_each_match_the_reference():
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
