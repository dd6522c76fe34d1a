"""Plugins whose static graphs are broken on purpose fail exactly the matching check, saying
what is wrong and how to fix it.

Each is a throwaway distribution: the stub NPU with an attention backend that claims
full graphs but reads its metadata on the host (which a real graph capture refuses), a
CPU platform whose ``GraphAPI`` replays into new tensors instead of the captured ones,
and one whose hand-written piecewise backend captures real (recorded) graphs but never
checks the input addresses.
"""

from __future__ import annotations

import textwrap

import pytest
from conformance_runs import messages, outcomes, run_cli

pytestmark = pytest.mark.slow

#: The stub NPU as "syncing_stub", serving ``syncing_attention:SyncingBackend``.
SYNCING_STUB_PLUGIN = """
    from slotwise.platforms import PlatformSpec
    from slotwise.plugins import hookimpl
    from slotwise_ascend_stub.platform import AscendStubPlatform

    class SyncingStubPlatform(AscendStubPlatform):
        name = "syncing_stub"

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_syncing_stub:SyncingStubPlatform"
        return [PlatformSpec("syncing_stub", platform_cls, lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("syncing_stub", "syncing_attention:SyncingBackend")
"""

#: The stub's reference backend, claiming (as it does) that full graphs may capture its
#: decode path, with that path reading the sequence lengths back to the host.
SYNCING_ATTENTION = """
    from slotwise_ascend_stub.attention import AscendStubReferenceBackend, AscendStubReferenceImpl

    class SyncingImpl(AscendStubReferenceImpl):
        def _decode(self, q, k, v, kv_cache, metadata, output):
            if {read} > 0:
                super()._decode(q, k, v, kv_cache, metadata, output)

    class SyncingBackend(AscendStubReferenceBackend):
        @classmethod
        def get_name(cls):
            return "SYNCING"

        @classmethod
        def get_impl_cls(cls):
            return SyncingImpl
"""

#: A CPU platform with static graphs of its own, run by slotwise's piecewise backend.
GRAPH_API_PLUGIN = """
    from slotwise.platforms import PlatformSpec
    from slotwise.plugins import hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class BrokenGraphsPlatform(CpuPlatform):
        name = "broken_graphs"

        def get_graph_api(self, **kwargs):
            from broken_graphs import graph_api

            return graph_api

        def get_piecewise_backend_cls(self, **kwargs):
            from broken_graphs import backend_cls

            return backend_cls

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_broken_graphs:BrokenGraphsPlatform"
        return [PlatformSpec("broken_graphs", platform_cls, lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("broken_graphs", "slotwise_cpu.attention:CpuSdpaBackend")
"""

#: "Captures" by remembering the work and "replays" by running it again into new tensors,
#: which it keeps: the tensors the capture returned are never written again.
REBINDING_GRAPHS = """
    class RebindingGraph:
        def capture(self, fn, pool, *, quiet):
            self.fn = fn
            self.outputs = fn()
            return self.outputs

        def replay(self):
            self.outputs = self.fn()

    class RebindingGraphAPI:
        def new_graph(self):
            return RebindingGraph()

        def pool(self):
            return None

        def weak_ref(self, outputs):
            return outputs

    graph_api = RebindingGraphAPI()
    backend_cls = None  # slotwise's own piecewise backend
"""

#: Recorded graphs (correct ones), captured and replayed by a hand-written piecewise
#: backend that never checks whether the inputs are still at the captured addresses.
UNCHECKED_GRAPHS = """
    from slotwise.plugin_api import CompiledPiecewiseBackend, GraphMode, RecordedGraphAPI
    from slotwise.plugin_api import try_get_forward_context
    from slotwise.compilation import counters

    class UncheckedGraphsBackend(CompiledPiecewiseBackend):
        def __init__(self, graph, config, **kwargs):
            super().__init__(graph, config, **kwargs)
            self.runs = {}
            self.graphs = {}

        def __call__(self, *args):
            size = self.runtime_size(args)
            context = try_get_forward_context()
            if context is None or context.graph_mode != GraphMode.PIECEWISE:
                return super().__call__(*args)
            if size in self.graphs:
                graph, outputs = self.graphs[size]
                graph.replay()
                return outputs
            self.runs[size] = self.runs.get(size, 0) + 1
            if self.runs[size] <= self.config.graph_warmups:
                return super().__call__(*args)
            graph = self.graph_api.new_graph()
            run = super().__call__
            outputs = graph.capture(lambda: run(*args), self.graph_api.pool(), quiet=True)
            self.graphs[size] = graph, outputs
            counters.bump("num_graphs_captured")
            return outputs

    graph_api = RecordedGraphAPI()
    backend_cls = UncheckedGraphsBackend
"""


def failing_checks(summary) -> set[str]:
    return {check for check, outcome in outcomes(summary).items() if outcome == "failed"}


@pytest.mark.parametrize(
    "read, op",
    [
        ("max(metadata.seq_lens.tolist())", "Tensor.tolist()"),
        ("metadata.seq_lens.max().item()", "Tensor.item()"),
    ],
)
def test_a_backend_reading_metadata_on_the_host_in_full_graphs_fails_the_attention_check(
    dists, read, op
):
    attention = SYNCING_ATTENTION.replace("{read}", read)
    (dists.root / "syncing_attention.py").write_text(textwrap.dedent(attention))
    dists.add("slotwise-syncing-stub", SYNCING_STUB_PLUGIN)
    summary, result = run_cli("syncing_stub", site=dists.root, SLOTWISE_ASCEND_STUB_DEVICES="1")
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"attention"}, summary
    problems = messages(summary, "attention")
    assert "attention backend SYNCING declares graph_support UNIFORM_DECODE but cannot be " in (
        problems
    )
    assert f"captured in a full graph on the static uniform_decode layout: {op}" in problems
    assert "reads a tensor's value back to the host (a host sync)" in problems


def test_a_graph_api_replaying_into_new_tensors_fails_the_static_graph_check(dists):
    (dists.root / "broken_graphs.py").write_text(textwrap.dedent(REBINDING_GRAPHS))
    dists.add("slotwise-broken-graphs", GRAPH_API_PLUGIN)
    summary, result = run_cli("broken_graphs", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"static_graphs"}, summary
    problems = messages(summary, "static_graphs").splitlines()
    assert len(problems) == 12  # every graph mode, every test
    for problem in problems:
        assert "capture run: StaticGraphError:" in problem
        assert (
            "replay() of RebindingGraphAPI did not write into the tensors capture() returned "
            "(every captured output still holds what slotwise wrote there before the replay); "
            "a replay must write its results in place into the captured outputs"
        ) in problem
        assert "address" not in problem


def test_a_piecewise_backend_skipping_the_address_check_is_told_the_fix(dists):
    (dists.root / "broken_graphs.py").write_text(textwrap.dedent(UNCHECKED_GRAPHS))
    dists.add("slotwise-broken-graphs", GRAPH_API_PLUGIN)
    summary, result = run_cli("broken_graphs", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"static_graphs"}, summary
    problems = messages(summary, "static_graphs").splitlines()
    # Its graphs are right; only the check it skips is missing, in the modes it captures.
    assert [problem.split(":")[1].split(",")[0].strip() for problem in problems] == [
        "PIECEWISE graphs",
        "FULL_AND_PIECEWISE graphs",
    ]
    for problem in problems:
        assert "replaying with a new input tensor (another address) did not raise" in problem
        assert (
            "The platform runs its pieces in its own UncheckedGraphsBackend "
            "(get_piecewise_backend_cls()), where slotwise's static-graph checks do not run: "
            "return None from get_piecewise_backend_cls() so that slotwise's "
            "StaticGraphPiecewiseBackend runs each piece on the platform's GraphAPI"
        ) in problem
        assert "call slotwise.plugin_api.check_input_addresses" in problem
