"""``GraphDispatcher``: each step's graphs for every mode, attention backend graph
support and batch shape, and the capture plan (semantics of vLLM's CudagraphDispatcher)."""

from __future__ import annotations

import pytest
import torch
from graph_test_platforms import BOTH, FULL, NONE, PIECEWISE, Graphs, NoGraphs, backend

from slotwise.attention.backend import GraphSupport
from slotwise.compilation import CompilationConfig, ConfigError, GraphMode
from slotwise.compilation.static_graphs.dispatcher import (
    CaptureCase,
    GraphDispatcher,
    MetadataLayout,
)
from slotwise.forward_context import BatchDescriptor, get_forward_context

AS_BUILT, UNIFORM, GENERAL = (
    MetadataLayout.AS_BUILT,
    MetadataLayout.UNIFORM_DECODE,
    MetadataLayout.GENERAL,
)
CAPTURE_SIZES = [4, 1, 2]  # in any order


def dispatcher(mode: GraphMode, backends=(), platform=None) -> GraphDispatcher:
    config = CompilationConfig(graph_mode=mode, capture_sizes=CAPTURE_SIZES)
    return GraphDispatcher(config, platform or Graphs(), backends)


#: (tokens, uniform decode) -> (runtime mode, padded size, metadata layout), per mode.
SHAPES = [(1, True), (1, False), (3, True), (3, False), (4, False), (5, True), (9, False)]
DECISIONS = {
    NONE: [(NONE, 1, AS_BUILT), (NONE, 1, AS_BUILT), (NONE, 3, AS_BUILT), (NONE, 3, AS_BUILT),
           (NONE, 4, AS_BUILT), (NONE, 5, AS_BUILT), (NONE, 9, AS_BUILT)],
    PIECEWISE: [(PIECEWISE, 1, AS_BUILT), (PIECEWISE, 1, AS_BUILT), (PIECEWISE, 4, AS_BUILT),
                (PIECEWISE, 4, AS_BUILT), (PIECEWISE, 4, AS_BUILT), (NONE, 5, AS_BUILT),
                (NONE, 9, AS_BUILT)],
    FULL: [(FULL, 1, GENERAL), (FULL, 1, GENERAL), (FULL, 4, GENERAL), (FULL, 4, GENERAL),
           (FULL, 4, GENERAL), (NONE, 5, AS_BUILT), (NONE, 9, AS_BUILT)],
    BOTH: [(FULL, 1, UNIFORM), (PIECEWISE, 1, AS_BUILT), (FULL, 4, UNIFORM),
           (PIECEWISE, 4, AS_BUILT), (PIECEWISE, 4, AS_BUILT), (NONE, 5, AS_BUILT),
           (NONE, 9, AS_BUILT)],
}  # fmt: skip
#: The modes each graph support allows (None: a model without attention).
ALLOWED = {
    None: {NONE, PIECEWISE, FULL, BOTH},
    GraphSupport.ALWAYS: {NONE, PIECEWISE, FULL, BOTH},
    GraphSupport.UNIFORM_DECODE: {NONE, PIECEWISE, BOTH},
    GraphSupport.PIECEWISE_ONLY: {NONE, PIECEWISE},
}


@pytest.mark.parametrize("support", list(ALLOWED), ids=lambda s: getattr(s, "name", "none"))
@pytest.mark.parametrize("mode", list(GraphMode), ids=lambda mode: mode.name)
def test_every_mode_backend_support_and_batch_shape(mode, support):
    backends = [] if support is None else [backend(support)]
    if mode not in ALLOWED[support]:
        with pytest.raises(ConfigError, match=f"{support.name}; use graph_mode="):
            dispatcher(mode, backends)
        return
    graphs = dispatcher(mode, backends)
    decided = [graphs.dispatch(tokens, uniform) for tokens, uniform in SHAPES]
    assert [(d.mode, d.padded_size, d.metadata_layout) for d in decided] == DECISIONS[mode]
    for (tokens, uniform), step in zip(SHAPES, decided, strict=True):
        assert step.batch_descriptor == BatchDescriptor(step.padded_size, uniform)
        assert step.padded_size >= tokens


def test_every_backend_of_the_model_must_allow_the_mode():
    backends = [backend(GraphSupport.ALWAYS), backend(GraphSupport.UNIFORM_DECODE)]
    with pytest.raises(ConfigError, match="UNIFORM_DECODE_BACKEND has graph_support"):
        dispatcher(FULL, backends)
    assert dispatcher(BOTH, backends).dispatch(2, True).mode == FULL


def test_a_platform_without_graphs_refuses_a_mode_that_captures():
    with pytest.raises(ConfigError, match="has no static graphs"):
        dispatcher(PIECEWISE, [backend(GraphSupport.ALWAYS)], platform=NoGraphs())


@pytest.mark.parametrize("config", [None, CompilationConfig(capture_sizes=[1, 2])])
def test_no_compiled_config_or_no_mode_means_no_graphs(config):
    graphs = GraphDispatcher(config, Graphs())
    assert graphs.capture_sizes == [] and graphs.capture_plan() == []
    step = graphs.dispatch(2, uniform_decode=True)
    assert (step.mode, step.padded_size, step.metadata_layout) == (NONE, 2, AS_BUILT)


@pytest.mark.parametrize(
    "mode, per_size",
    [
        (NONE, []),
        (PIECEWISE, [(PIECEWISE, False)]),
        (FULL, [(FULL, False)]),
        (BOTH, [(FULL, True), (PIECEWISE, False)]),
    ],
)
def test_the_capture_plan_lists_every_graph_set_largest_size_first(mode, per_size):
    expected = [CaptureCase(size, m, uniform) for size in (4, 2, 1) for m, uniform in per_size]
    graphs = dispatcher(mode)
    assert graphs.capture_plan() == expected
    for case in expected:  # each case is a batch shape that dispatches to its graphs
        assert graphs.dispatch(case.size, case.uniform_decode).mode == case.mode


def test_a_step_carries_the_decision_in_the_forward_context():
    metadata = object()
    with dispatcher(BOTH).step(3, uniform_decode=True, attn_metadata=metadata) as step:
        context = get_forward_context()
        assert (context.graph_mode, context.attn_metadata) == (FULL, metadata)
        assert context.batch_descriptor == BatchDescriptor(4, uniform_decode=True)
        assert step.padded_size == 4


def test_a_model_without_a_compiled_module_gets_a_dispatcher_without_graphs():
    graphs = GraphDispatcher.for_model(torch.nn.Linear(2, 2))
    assert graphs.graph_mode == NONE and graphs.capture_plan() == []
