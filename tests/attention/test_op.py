"""``torch.ops.slotwise.unified_attention_with_output`` and the Attention layer around it."""

from __future__ import annotations

import gc

import pytest
import torch
from attention_models import HEAD_SIZE, HEADS, KV_HEADS, HeadMajorReferenceBackend, TwoLayers

from slotwise.attention import (
    UNIFIED_ATTENTION_OP,
    Attention,
    AttentionMetadataBuilder,
    allocate_kv_caches,
    get_attention_layer,
)
from slotwise.compilation.config import DEFAULT_SPLITTING_OPS
from slotwise.forward_context import set_forward_context
from slotwise.testing.conformance.reference_attention import causal_attention

BLOCK_SIZE = 8


def two_layers() -> TwoLayers:
    """Over head-major blocks, unlike the core's default layout, so the cache's shape
    shows whose it is."""
    return TwoLayers(HeadMajorReferenceBackend, block_size=BLOCK_SIZE)


def metadata_for(query_lens: list[int]):
    blocks = [[2 * r, 2 * r + 1] for r in range(len(query_lens))]
    return AttentionMetadataBuilder(BLOCK_SIZE).build(query_lens, [0] * len(query_lens), blocks)


def test_the_op_is_the_default_splitting_op():
    assert UNIFIED_ATTENTION_OP in DEFAULT_SPLITTING_OPS
    schema = torch.ops.slotwise.unified_attention_with_output.default._schema
    assert [a.name for a in schema.arguments if a.is_write] == ["out"]


def test_layer_matches_the_reference_on_a_prefill():
    model = two_layers()
    allocate_kv_caches(model, num_blocks=8)
    q, k, v = torch.randn(5, HEADS * HEAD_SIZE), torch.randn(5, 32), torch.randn(5, 32)
    with set_forward_context(metadata_for([5])):
        out = model.attn[0](q, k, v)
    expected = causal_attention(
        q.view(5, HEADS, HEAD_SIZE), k.view(5, KV_HEADS, HEAD_SIZE), v.view(5, KV_HEADS, -1), 0.25
    )
    torch.testing.assert_close(
        out.view(5, HEADS, HEAD_SIZE).double(), expected, atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dynamo_traces_the_model_without_a_graph_break(backend):
    model = two_layers()
    allocate_kv_caches(model, num_blocks=8)
    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    x = torch.randn(6, 32)
    metadata = metadata_for([4, 2])
    with set_forward_context(metadata):
        expected = model(x)
    compiled = torch.compile(model, fullgraph=True, backend=capture)
    with set_forward_context(metadata):
        got = compiled(x)
    torch.testing.assert_close(got, expected)
    assert len(graphs) == 1
    op = torch.ops.slotwise.unified_attention_with_output
    calls = [node for node in graphs[0].graph.nodes if node.target in (op, op.default)]
    assert len(calls) == 2


def test_no_metadata_zero_fills_and_leaves_the_cache_alone():
    model = two_layers()
    allocate_kv_caches(model, num_blocks=8)
    layer = model.attn[0]
    out = torch.full((3, HEADS, HEAD_SIZE), 7.0)
    q = torch.randn(3, HEADS, HEAD_SIZE)
    k = v = torch.randn(3, KV_HEADS, HEAD_SIZE)
    with set_forward_context(None):
        torch.ops.slotwise.unified_attention_with_output(q, k, v, out, layer.layer_name)
    assert not out.any()
    assert not layer.kv_cache.any()


def test_metadata_per_layer_is_looked_up_by_name():
    model = two_layers()
    allocate_kv_caches(model, num_blocks=8)
    x = torch.randn(3, 32)
    names = [attn.layer_name for attn in model.attn]
    with set_forward_context(metadata_for([3])):
        expected = model(x)
    with set_forward_context({name: metadata_for([3]) for name in names}):
        torch.testing.assert_close(model(x), expected)
    with (
        set_forward_context({names[0]: metadata_for([3])}),
        pytest.raises(KeyError, match=names[1]),
    ):
        model(x)


def test_layer_without_a_cache_names_the_fix():
    model = two_layers()
    with set_forward_context(metadata_for([2])), pytest.raises(RuntimeError, match="allocate_kv"):
        model(torch.randn(2, 32))


def test_layer_names_are_unique_while_the_layer_lives():
    def make() -> Attention:
        return Attention(2, 8, 1.0, prefix="op_test_unique", backend=HeadMajorReferenceBackend)

    layer = make()
    assert get_attention_layer("op_test_unique") is layer
    with pytest.raises(ValueError, match="already exists"):
        make()
    del layer
    gc.collect()
    again = make()
    assert get_attention_layer("op_test_unique") is again
    del again
    gc.collect()
    with pytest.raises(KeyError, match="op_test_unique"):
        get_attention_layer("op_test_unique")


def test_a_model_built_after_another_died_reuses_its_layer_names():
    """Layer names are constants of a whole compiled graph: reusing the lowest free
    number lets a process that built (and dropped) other models first find the compile
    cache entries of a process that built only this one."""
    from slotwise.compilation import CompilationConfig
    from slotwise_engine.models.llama import build_llama

    def prefixes(model: torch.nn.Module) -> set[str]:
        return {m.layer_name.split(".")[0] for m in model.modules() if isinstance(m, Attention)}

    level3 = CompilationConfig(level=3, backend="eager")
    first = build_llama("tiny", compilation_config=level3)
    with set_forward_context(None):  # compiled: now held in reference cycles
        first(torch.tensor([1, 2]), torch.tensor([0, 1]))
    (name,) = prefixes(first)
    second = build_llama("tiny", compilation_config=level3)
    assert len(prefixes(second)) == 1 and prefixes(second) != {name}  # the first still lives
    del first
    assert prefixes(build_llama("tiny", compilation_config=level3)) == {name}


def test_allocate_kv_caches_uses_the_backend_shape_and_binds_each_layer():
    model = two_layers()
    caches = allocate_kv_caches(model, num_blocks=5, dtype=torch.bfloat16)
    assert set(caches) == {attn.layer_name for attn in model.attn}
    for attn in model.attn:
        assert attn.kv_cache is caches[attn.layer_name]
        assert attn.attn_backend is HeadMajorReferenceBackend
        assert attn.kv_cache.shape == (2, 5, KV_HEADS, BLOCK_SIZE, HEAD_SIZE)
        assert attn.kv_cache.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="no slotwise Attention"):
        allocate_kv_caches(torch.nn.Linear(2, 2), num_blocks=5)
