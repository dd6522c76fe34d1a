"""After its one trace, a compiled model is called without torch.compile: no Dynamo frame
evaluation (torch.profiler shows no "Torch-Compiled Region"), the same outputs as the call
through torch.compile and as eager, and weights replaced later either followed or refused.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from support import clean_env
from torch import nn
from torch.autograd.profiler import profile

from slotwise.compilation import CompilationConfig, counters, support_torch_compile
from slotwise.compilation.direct_entry import CompiledModelChangedError, CompiledModelInputError
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, ToyTransformer, attend

EAGER_LEVEL3 = CompilationConfig(level=3, backend="eager", splitting_ops=TOY_SPLITTING_OPS)


def compiled_regions(call) -> int:
    """How many times ``call()`` entered a frame compiled by torch.compile."""
    with profile(use_kineto=False) as prof:  # the legacy profiler starts in milliseconds
        call()
    return sum(e.name.startswith("Torch-Compiled Region") for e in prof.function_events)


def toy_pair(config: CompilationConfig, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    compiled = ToyTransformer(compilation_config=config)
    eager = ToyTransformer(compilation_config=CompilationConfig(level=0))
    eager.load_state_dict(compiled.state_dict())
    return compiled, eager


def ids(size: int) -> torch.Tensor:
    return torch.randint(0, 64, (size,), generator=torch.Generator().manual_seed(size))


@pytest.mark.parametrize(
    "config",
    [
        EAGER_LEVEL3,
        CompilationConfig(level=2, backend="eager"),
        CompilationConfig(
            level=3, backend="eager", splitting_ops=TOY_SPLITTING_OPS, compile_sizes=[2]
        ),
    ],
    ids=["level3", "level2", "level3-compile-size-2"],
)
def test_calls_after_the_trace_skip_torch_compile_and_match_it(config):
    compiled, eager = toy_pair(config)
    with counters.expect(num_models_seen=1, num_graphs_seen=1):
        through_torch_compile = compiled(ids(1))  # the first call traces
        assert compiled_regions(lambda: compiled(ids(1))) == 0
        outputs = {size: compiled(ids(size)) for size in (1, 2, 3, 4, 2, 1)}
    # The same graph behind both entries: bit for bit the output of the traced call.
    assert torch.equal(outputs[1], through_torch_compile)
    for size, output in outputs.items():
        torch.testing.assert_close(output, eager(ids(size)), msg=f"size {size}")


def test_level_one_keeps_torch_compile_which_retraces_per_size():
    config = CompilationConfig(level=1, backend="eager", splitting_ops=TOY_SPLITTING_OPS)
    compiled, eager = toy_pair(config)
    compiled(ids(1))
    assert compiled_regions(lambda: compiled(ids(3))) == 1
    for size in (1, 2, 3):
        torch.testing.assert_close(compiled(ids(size)), eager(ids(size)))


@pytest.mark.slow
@pytest.mark.parametrize("partition", [False, True], ids=["fx-split", "inductor-partition"])
def test_inductor_pieces_give_the_torch_compile_outputs(tmp_path, partition):
    config = CompilationConfig(
        level=3,
        backend="inductor",
        splitting_ops=TOY_SPLITTING_OPS,
        use_inductor_graph_partition=partition,
        cache_dir=str(tmp_path),
    )
    compiled, eager = toy_pair(config)
    through_torch_compile = compiled(ids(2))
    assert compiled_regions(lambda: compiled(ids(2))) == 0
    assert torch.equal(compiled(ids(2)), through_torch_compile)
    for size in (1, 3, 2):
        torch.testing.assert_close(compiled(ids(size)), eager(ids(size)))


class Scaled(nn.Module):
    """A model with a parameter, a buffer and a plain tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.offset = torch.zeros(8)  # neither parameter nor buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return attend(self.proj(x), x, x) * self.scale + self.offset


CompiledScaled = support_torch_compile(type("CompiledScaled", (Scaled,), {}))


def scaled_pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    compiled = CompiledScaled(compilation_config=EAGER_LEVEL3)
    eager = Scaled()
    eager.load_state_dict(compiled.state_dict())
    compiled(torch.randn(1, 8))  # the trace
    return compiled, eager


def assert_agree(compiled: nn.Module, eager: nn.Module) -> None:
    for size in (1, 2, 5):
        x = torch.randn(size, 8, generator=torch.Generator().manual_seed(size))
        torch.testing.assert_close(compiled(x), eager(x), msg=f"size {size}")


def test_replaced_parameters_and_buffers_are_followed(caplog):
    compiled, eager = scaled_pair()
    for model in (compiled, eager):
        torch.manual_seed(1)
        model.proj.weight = nn.Parameter(torch.randn(8, 8))
        model.register_buffer("scale", torch.full((8,), 3.0))
        model.offset = torch.ones(8)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        assert_agree(compiled, eager)
    assert "re-bound 2 replaced weights (proj.weight, scale)" in caplog.text
    state = {key: torch.randn_like(value) for key, value in eager.state_dict().items()}
    for model in (compiled, eager):
        model.load_state_dict(state, assign=True)
    assert_agree(compiled, eager)
    with counters.expect(num_graphs_seen=0):
        assert compiled_regions(lambda: compiled(torch.randn(3, 8))) == 0


def test_weights_changed_in_place_are_followed():
    compiled, eager = scaled_pair()
    new_weight = torch.randn(8, 8)
    with torch.no_grad():
        for model in (compiled, eager):
            model.proj.bias.mul_(5)
            model.proj.weight.data = new_weight.clone()  # the same Parameter, new data
    assert_agree(compiled, eager)


def test_a_weight_the_graph_cannot_take_is_refused():
    compiled, _ = scaled_pair()
    compiled.proj.weight = nn.Parameter(torch.randn(8, 4))
    with pytest.raises(CompiledModelChangedError, match=r"proj\.weight .*\(8, 4\).*\(8, 8\)"):
        compiled(torch.randn(2, 8))
    compiled, _ = scaled_pair()
    compiled.register_buffer("scale", None)
    with pytest.raises(CompiledModelChangedError, match="scale .*removed or set to a NoneType"):
        compiled(torch.randn(2, 8))


def test_a_replaced_submodule_is_refused():
    compiled, _ = toy_pair(EAGER_LEVEL3)
    compiled(ids(2))
    compiled.layers[1] = nn.Identity()
    with pytest.raises(CompiledModelChangedError, match=r"\(layers\.1\).*Build \(and compile\)"):
        compiled(ids(2))


def test_bad_arguments_get_one_clear_error():
    compiled, _ = toy_pair(EAGER_LEVEL3)
    compiled(ids(2))
    with pytest.raises(CompiledModelInputError, match="ToyTransformer.forward: too many"):
        compiled(ids(2), ids(2))
    with pytest.raises(CompiledModelInputError, match="input_ids.size.0.*'input_ids' .an int."):
        compiled(3)
    with pytest.raises(TypeError):  # a TypeError too, as without the direct entry
        compiled()


@support_torch_compile
class CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.calls = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1  # replayed by Dynamo's bytecode on every call
        return self.proj(x)


def test_a_forward_with_side_effects_keeps_torch_compile_with_one_warning(caplog):
    model = CountsCalls(compilation_config=CompilationConfig(level=3, backend="eager"))
    with caplog.at_level(logging.WARNING, logger="slotwise"):
        for size in (1, 2, 3):
            torch.testing.assert_close(model(torch.ones(size, 4)), model.proj(torch.ones(size, 4)))
    assert model.calls.item() == 3
    warnings = [r.getMessage() for r in caplog.records if "direct entry" in r.getMessage()]
    assert warnings == [
        "CountsCalls is called through torch.compile's entry (Dynamo's frame evaluation on "
        "every call), not slotwise's direct entry: forward changes L['self'], which Dynamo "
        "replays"
    ]


def test_torch_compile_disable_runs_eagerly():
    import torch._dynamo.config

    # config.patch, not monkeypatch: undoing a monkeypatch deletes the setting, which
    # hides it from every later test in the process.
    with torch._dynamo.config.patch(disable=True), counters.expect(num_graphs_seen=0):
        compiled, eager = scaled_pair()
        assert_agree(compiled, eager)
        compiled.proj.weight = eager.proj.weight = nn.Parameter(torch.randn(8, 8))
        assert_agree(compiled, eager)


WARM_START = textwrap.dedent(
    """
    import json, logging, sys
    import torch
    from torch import nn
    from torch.autograd.profiler import profile
    from slotwise.compilation import CompilationConfig, counters
    from slotwise.testing.toy_models import TOY_SPLITTING_OPS, ToyTransformer

    logging.basicConfig(level=logging.INFO)
    config = CompilationConfig(level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS,
                               cache_dir=sys.argv[1])
    torch.manual_seed(0)
    model = ToyTransformer(compilation_config=config)
    ids = [torch.arange(size) for size in (1, 2, 5)]
    out = [model(x).tolist() for x in ids]
    with profile(use_kineto=False) as prof:
        out += [model(x).tolist() for x in ids]
    regions = sum(e.name.startswith("Torch-Compiled Region") for e in prof.function_events)
    torch.manual_seed(1)
    model.head.weight = nn.Parameter(torch.randn(64, 16))
    out.append(model(ids[1]).tolist())
    print(json.dumps({"out": out, "regions": regions, "graphs": counters.num_graphs_seen}))
    """
)


@pytest.mark.slow
def test_a_warm_started_model_gets_the_direct_entry(tmp_path):
    def run() -> dict:
        result = subprocess.run(
            [sys.executable, "-c", WARM_START, str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            timeout=300,
            env=clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.splitlines()[-1])
        report["log"] = result.stderr
        return report

    cold, warm = run(), run()
    assert cold["graphs"] == 1 and warm["graphs"] == 0, warm["log"]
    assert "rebuilt from its saved trace" in warm["log"]
    assert cold["regions"] == warm["regions"] == 0
    assert warm["out"] == cold["out"]
    assert "re-bound 1 replaced weights (head.weight)" in warm["log"]
    torch.manual_seed(0)
    eager = ToyTransformer(compilation_config=CompilationConfig(level=0))
    torch.manual_seed(1)
    eager.head.weight = nn.Parameter(torch.randn(64, 16))
    torch.testing.assert_close(torch.tensor(warm["out"][-1]), eager(torch.arange(2)))
