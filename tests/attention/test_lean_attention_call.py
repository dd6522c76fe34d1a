"""The attention op between compiled pieces: a plain call bound to its layer.

A split graph calls each layer's ``LayerAttention`` instead of going through torch's
dispatcher to ``torch.ops.slotwise.unified_attention_with_output``; these tests check
that the split graph really does, that it computes what eager does (on reference
backends of both cache layouts), that both ways behave alike on the edge cases (no
metadata, padding rows, a missing cache or metadata entry), that the profiler
still shows the op, and that layers are bound by name, so a model freed and rebuilt
under the same names runs on its own layers and the freed one is not kept alive.
"""

from __future__ import annotations

import gc
import pickle
import weakref

import pytest
import torch
from attention_models import (
    HEAD_SIZE,
    HEADS,
    HIDDEN,
    KV_HEADS,
    HeadMajorReferenceBackend,
    ReferenceBackend,
    TwoLayers,
)

import slotwise
from slotwise.attention import (
    UNIFIED_ATTENTION_OP,
    AttentionMetadataBuilder,
    allocate_kv_caches,
)
from slotwise.attention.layer import unused_layer_prefix
from slotwise.attention.ops import LayerAttention, layer_attention
from slotwise.compilation import CompilationConfig
from slotwise.compilation.splitting import dynamo_backends
from slotwise.compilation.splitting.fx_split import op_names, split_graph
from slotwise.forward_context import set_forward_context

BLOCK_SIZE = 8
BACKENDS = [HeadMajorReferenceBackend, ReferenceBackend]
SPLIT = CompilationConfig(level=3, backend="eager", splitting_ops=[UNIFIED_ATTENTION_OP])


def two_layers(backend: type, prefix: str | None = None) -> TwoLayers:
    return TwoLayers(backend, block_size=BLOCK_SIZE, prefix=prefix)


def twins(backend: type, seed: int = 0) -> tuple[TwoLayers, TwoLayers]:
    """The same weights twice, each with its own caches: one compiled at level 3 and
    split at the attention op, one eager."""
    torch.manual_seed(seed)
    compiled, eager = two_layers(backend), two_layers(backend)
    eager.load_state_dict(compiled.state_dict())
    for model in (compiled, eager):
        allocate_kv_caches(model, num_blocks=16)
    return slotwise.compile(compiled, SPLIT), eager


def metadata(query_lens: list[int], context_lens: list[int]):
    blocks = [[4 * r + b for b in range(4)] for r in range(len(query_lens))]
    return AttentionMetadataBuilder(BLOCK_SIZE).build(query_lens, context_lens, blocks)


#: (query_lens, context_lens, padding rows) per step, each request growing step to step.
STEPS = [
    ([5, 3], [0, 0], 0),  # prefills
    ([1, 1], [5, 3], 2),  # decodes, padded to a larger size
    ([1, 4], [6, 4], 1),  # mixed, crossing a block boundary
    ([1, 1], [7, 8], 0),
]


@pytest.fixture
def split_graphs(monkeypatch):
    """The split graphs level-3 compilation builds, as it runs them."""
    made = []

    def recording(graph, splitting_ops):
        split, pieces = split_graph(graph, splitting_ops)
        made.append(split)
        return split, pieces

    monkeypatch.setattr(dynamo_backends, "split_graph", recording)
    return made


def calls_of_the_op(graph: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [
        node
        for module in graph.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if UNIFIED_ATTENTION_OP in op_names(node.target)
    ]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.get_name())
def test_the_split_graph_calls_each_layer_directly_and_matches_eager(backend, split_graphs):
    compiled, eager = twins(backend)
    torch.manual_seed(1)
    for query_lens, context_lens, padding in STEPS:
        x = torch.randn(sum(query_lens) + padding, HIDDEN)
        with set_forward_context(metadata(query_lens, context_lens)):
            expected = eager(x)
        with set_forward_context(metadata(query_lens, context_lens)):
            got = compiled(x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for compiled_layer, eager_layer in zip(compiled.attn, eager.attn, strict=True):
        torch.testing.assert_close(compiled_layer.kv_cache, eager_layer.kv_cache)

    (split,) = split_graphs
    assert calls_of_the_op(split) == []
    direct = [node.target for node in split.graph.nodes if isinstance(node.target, LayerAttention)]
    assert [call.layer_name for call in direct] == [attn.layer_name for attn in compiled.attn]


def test_without_metadata_the_split_graph_zero_fills_like_eager():
    compiled, eager = twins(HeadMajorReferenceBackend)
    x = torch.randn(3, HIDDEN)
    with set_forward_context(None):
        torch.testing.assert_close(compiled(x), eager(x))
    assert not any(attn.kv_cache.any() for attn in compiled.attn)


@pytest.mark.parametrize("way", ["op", "direct"])
def test_both_ways_zero_the_padding_rows_and_fill_without_metadata(way):
    model = two_layers(HeadMajorReferenceBackend)
    allocate_kv_caches(model, num_blocks=16)
    layer = model.attn[0]
    q = torch.randn(5, HEADS, HEAD_SIZE)
    k = v = torch.randn(5, KV_HEADS, HEAD_SIZE)

    def attend(out: torch.Tensor) -> torch.Tensor:
        if way == "op":
            torch.ops.slotwise.unified_attention_with_output(q, k, v, out, layer.layer_name)
        else:
            layer_attention(layer.layer_name)(q, k, v, out)
        return out

    with set_forward_context(None):
        assert not attend(torch.full_like(q, 7.0)).any()
    with set_forward_context(metadata([3], [0])):
        out = attend(torch.full_like(q, 7.0))
    assert out[:3].abs().sum() > 0 and not out[3:].any()


@pytest.mark.parametrize("way", ["op", "direct", "split graph"])
def test_a_missing_cache_or_metadata_entry_raises_the_same_error_every_way(way):
    model = two_layers(HeadMajorReferenceBackend)
    names = [attn.layer_name for attn in model.attn]
    q = torch.randn(2, HEADS * HEAD_SIZE)
    k = torch.randn(2, KV_HEADS * HEAD_SIZE)
    if way == "split graph":
        model = slotwise.compile(model, SPLIT)

    def run() -> None:
        if way == "split graph":
            model(torch.randn(2, HIDDEN))
            return
        q3, k3 = q.view(2, HEADS, HEAD_SIZE), k.view(2, KV_HEADS, HEAD_SIZE)
        out = torch.empty_like(q3)
        if way == "op":
            torch.ops.slotwise.unified_attention_with_output(q3, k3, k3, out, names[0])
        else:
            layer_attention(names[0])(q3, k3, k3, out)

    with set_forward_context(metadata([2], [0])), pytest.raises(RuntimeError) as missing_cache:
        run()
    assert str(missing_cache.value) == (
        f"Attention layer {names[0]!r} has no KV cache; call "
        "slotwise.attention.allocate_kv_caches(model, num_blocks) first"
    )
    allocate_kv_caches(model, num_blocks=16)
    with set_forward_context({"another.layer": metadata([2], [0])}), pytest.raises(KeyError) as err:
        run()
    assert err.value.args == (f"the forward context's attn_metadata has no entry for {names[0]!r}",)


def test_the_profiler_shows_each_direct_call_under_the_op_name():
    compiled, _ = twins(HeadMajorReferenceBackend)
    x = torch.randn(3, HIDDEN)
    with set_forward_context(metadata([3], [0])):
        compiled(x)  # compiled outside the profile
        with torch.profiler.profile() as profile:
            compiled(x)
    names = [event.name for event in profile.events()]
    assert names.count(UNIFIED_ATTENTION_OP) == 2


def test_a_model_rebuilt_under_freed_names_runs_on_its_own_layers():
    prefix = unused_layer_prefix("lean_call_rebuilt")
    first = slotwise.compile(two_layers(HeadMajorReferenceBackend, prefix), SPLIT)
    allocate_kv_caches(first, num_blocks=16)
    x = torch.randn(4, HIDDEN)
    with set_forward_context(metadata([4], [0])):
        first(x)
    freed = weakref.ref(first.attn[0])
    del first
    gc.collect()
    assert freed() is None  # the split graph's calls do not keep its layers alive

    torch.manual_seed(3)
    second = two_layers(HeadMajorReferenceBackend, prefix)
    eager = two_layers(HeadMajorReferenceBackend)
    eager.load_state_dict(second.state_dict())
    for model in (second, eager):
        allocate_kv_caches(model, num_blocks=16)
    second = slotwise.compile(second, SPLIT)
    with set_forward_context(metadata([4], [0])):
        expected = eager(x)
    with set_forward_context(metadata([4], [0])):
        torch.testing.assert_close(second(x), expected)
    assert second.attn[0].kv_cache.any()


def test_a_direct_call_pickles_by_layer_name():
    call = layer_attention("lean_call_pickled.0")
    assert pickle.loads(pickle.dumps(call)) is call
