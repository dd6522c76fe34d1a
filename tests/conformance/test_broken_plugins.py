"""Plugins broken on purpose fail exactly the matching conformance check, readably.

Each is a throwaway distribution whose platform subclasses the CPU platform (so
everything else about it is sound): an attention backend that is off by one, a
static-graph backend that ignores the captured addresses, a probe that imports
torch, an attention backend that claims full graphs may capture it but reads the
real token count off the metadata tensors, and an RMSNorm that skips empty batches in
Python, as a kernel launcher does.
"""

from __future__ import annotations

import textwrap

import pytest
from conformance_runs import messages, outcomes, run_cli

pytestmark = pytest.mark.slow

#: A platform that is the CPU's under the name "wrong_attention", with an attention
#: backend that adds 1 to every output.
WRONG_ATTENTION_PLUGIN = """
    from slotwise.platforms import PlatformSpec
    from slotwise.plugins import hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class WrongAttentionPlatform(CpuPlatform):
        name = "wrong_attention"

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_wrong_attention:WrongAttentionPlatform"
        return [PlatformSpec("wrong_attention", platform_cls, lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("wrong_attention", "off_by_one_attention:OffByOneBackend")
"""

OFF_BY_ONE_ATTENTION = """
    from slotwise_cpu.attention import CpuSdpaBackend, CpuSdpaImpl

    class OffByOneImpl(CpuSdpaImpl):
        def forward(self, layer, q, k, v, kv_cache, metadata, output):
            super().forward(layer, q, k, v, kv_cache, metadata, output)
            output += 1

    class OffByOneBackend(CpuSdpaBackend):
        @classmethod
        def get_name(cls):
            return "OFF_BY_ONE"

        @classmethod
        def get_impl_cls(cls):
            return OffByOneImpl
"""

#: A CPU platform that claims static graphs and runs its pieces in its own backend,
#: ``RememberingBackend``, which never uses the graph API.
STALE_GRAPHS_PLUGIN = """
    from slotwise.platforms import PlatformSpec
    from slotwise.plugins import hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class UnusedGraphApi:
        def new_graph(self):
            raise NotImplementedError

        def pool(self):
            return "the one pool"

        def weak_ref(self, outputs):
            return outputs

    class StaleGraphsPlatform(CpuPlatform):
        name = "stale_graphs"

        def get_graph_api(self, **kwargs):
            return UnusedGraphApi()

        def get_piecewise_backend_cls(self, **kwargs):
            from remembering_graphs import RememberingBackend

            return RememberingBackend

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_stale_graphs:StaleGraphsPlatform"
        return [PlatformSpec("stale_graphs", platform_cls, lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("stale_graphs", "slotwise_cpu.attention:CpuSdpaBackend")
"""

#: "Captures" a size by remembering the outputs of its second run and "replays" by
#: returning them: it never reads the inputs again, nor checks their addresses.
REMEMBERING_GRAPHS = """
    from slotwise.compilation import CompiledPiecewiseBackend, GraphMode, counters
    from slotwise.forward_context import try_get_forward_context

    class RememberingBackend(CompiledPiecewiseBackend):
        def __init__(self, graph, config, **kwargs):
            super().__init__(graph, config, **kwargs)
            self.runs = {}
            self.remembered = {}

        def __call__(self, *args):
            size = self.runtime_size(args)
            context = try_get_forward_context()
            if context is None or context.graph_mode != GraphMode.PIECEWISE:
                return super().__call__(*args)
            if size in self.remembered:
                return self.remembered[size]
            out = super().__call__(*args)
            self.runs[size] = self.runs.get(size, 0) + 1
            if self.runs[size] > self.config.graph_warmups:
                self.remembered[size] = out
                counters.bump("num_graphs_captured")
            return out
"""

#: A CPU platform whose probe asks torch whether there is a GPU.
TORCH_PROBE_PLUGIN = """
    from slotwise.platforms import PlatformSpec
    from slotwise.plugins import hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class TorchProbePlatform(CpuPlatform):
        name = "torch_probe"

    def probe():
        import torch

        torch.cuda.is_available()
        return bool(torch.ones(1))

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_torch_probe:TorchProbePlatform"
        return [PlatformSpec("torch_probe", platform_cls, probe, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register("torch_probe", "slotwise_cpu.attention:CpuSdpaBackend")
"""


#: The stub NPU's reference backend claiming ALWAYS, though its general path was only
#: written for batches whose requests all have tokens: a full graph's request slots
#: left over after the real and padding requests have none.
OVERCLAIMING_ATTENTION = """
    from slotwise.attention import GraphSupport
    from slotwise_ascend_stub.attention import AscendStubReferenceBackend

    class OverclaimingBackend(AscendStubReferenceBackend):
        graph_support = GraphSupport.ALWAYS

        @classmethod
        def get_name(cls):
            return "OVERCLAIMING"
"""

#: The CPU platform as "size_branching", replacing RMSNorm with one that returns early
#: for an empty batch: right in eager mode, untraceable where the batch size is a symbol.
SIZE_BRANCHING_PLUGIN = """
    from slotwise.plugin_api import PlatformSpec, hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class SizeBranchingPlatform(CpuPlatform):
        name = "size_branching"

    def rms_norm(layer, x, residual=None):
        if x.shape[0] == 0:
            return layer.forward_native(x, residual)
        return layer.forward_native(x, residual)

    @hookimpl
    def slotwise_platforms():
        platform_cls = "slotwise_size_branching:SizeBranchingPlatform"
        return [PlatformSpec("size_branching", platform_cls, lambda: True, priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register_own("slotwise_cpu.attention:CpuSdpaBackend")

    @hookimpl
    def slotwise_register_custom_ops(registry):
        registry.register_own("rms_norm", rms_norm)
"""


def failing_checks(summary) -> set[str]:
    return {check for check, outcome in outcomes(summary).items() if outcome == "failed"}


def test_wrong_attention_output_fails_the_attention_check(dists):
    (dists.root / "off_by_one_attention.py").write_text(textwrap.dedent(OFF_BY_ONE_ATTENTION))
    dists.add("slotwise-wrong-attention", WRONG_ATTENTION_PLUGIN)
    summary, result = run_cli("wrong_attention", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"attention"}, summary
    assert outcomes(summary)["interface"] == "passed"
    problem = messages(summary, "attention").splitlines()[0]
    assert problem.startswith("platform 'wrong_attention': attention backend OFF_BY_ONE")
    assert "differs from the reference" in problem
    assert "max |error| 1" in problem


def test_static_graphs_that_ignore_addresses_fail_the_static_graph_check(dists):
    (dists.root / "remembering_graphs.py").write_text(textwrap.dedent(REMEMBERING_GRAPHS))
    dists.add("slotwise-stale-graphs", STALE_GRAPHS_PLUGIN)
    summary, result = run_cli("stale_graphs", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"static_graphs"}, summary
    assert outcomes(summary)["compile"] == "passed"
    problems = messages(summary, "static_graphs")
    assert "size 1, replay run" in problems
    assert "after zeroing the captured input buffer" in problems
    assert "did not raise slotwise.compilation.StaticGraphError" in problems


def test_a_probe_that_imports_torch_fails_the_probe_check(dists):
    dists.add("slotwise-torch-probe", TORCH_PROBE_PLUGIN)
    summary, result = run_cli("torch_probe", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"probe"}, summary
    problems = messages(summary, "probe")
    assert "probes must read device files or NVML, not torch" in problems
    assert "must finish within 100 ms" in problems


def test_a_backend_claiming_full_graphs_it_cannot_serve_fails_the_attention_check(dists):
    (dists.root / "off_by_one_attention.py").write_text(textwrap.dedent(OVERCLAIMING_ATTENTION))
    plugin = WRONG_ATTENTION_PLUGIN.replace("OffByOneBackend", "OverclaimingBackend")
    dists.add("slotwise-wrong-attention", plugin)
    summary, result = run_cli("wrong_attention", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"attention"}, summary
    problems = messages(summary, "attention")
    assert (
        "attention backend OVERCLAIMING declares graph_support ALWAYS but cannot be captured "
        "in a full graph on the static general layout: " in problems
    )
    assert "during a static-graph capture: it reads a tensor's value back to the host" in (problems)


def test_a_custom_op_branching_on_the_batch_size_fails_the_custom_op_check(dists):
    dists.add("slotwise-size-branching", SIZE_BRANCHING_PLUGIN)
    summary, result = run_cli("size_branching", site=dists.root)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"custom_ops"}, summary
    check = next(c for c in summary["checks"] if c["check"] == "custom_ops")
    failed = [test["name"] for test in check["tests"] if test["outcome"] == "failed"]
    # Its eager result is right; only the level-3 compile of rms_norm fails.
    assert failed == ["test_custom_op_compiles_at_level_3_for_every_batch_size[rms_norm]"]
    problem = messages(summary, "custom_ops")
    assert problem.startswith(
        "platform 'size_branching': custom op 'rms_norm' (plugin implementation) does not "
        "compile at level 3, where the batch size is a symbol"
    )
    assert "put the kernel behind a torch op" in problem
