"""Warm starts are exact: a process that reuses a saved Dynamo trace computes what eager
PyTorch computes on *its* model, whatever changed since the trace was saved.

Every model below depends on one thing that the cold process and the warm process set
differently, without changing the source files or the weights' shapes: a config
object's field, a global read from the environment (in the model's module or another),
a class attribute, a closure variable, a dict value, a default argument, a variable of
the scope the class was made in, a submodule or global module hook, tied weights, a
plain tensor attribute's size, the sizes declared dynamic, the distributed rank. A
fresh Dynamo trace would bake the new value in, so a warm process must notice the change
and trace again. The oracle is the model's own forward run eagerly in the same process;
an unchanged model shows that the warm path is taken whenever nothing changed.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support import clean_env, free_port, run_together, torchrun_env

pytestmark = pytest.mark.slow

# Eager pieces the compile cache treats as persistent: the cache then keeps warm-start
# entries, and nothing but Dynamo's trace is under test.
PERSISTENT_EAGER = textwrap.dedent(
    """
    from slotwise.compilation.compilers import CompiledPiece, Compiler

    class PersistentEager(Compiler):
        name = "persistent-eager"
        supports_persistence = True

        def compile(self, graph, example_inputs, *, runtime_shape):
            return CompiledPiece(fn=graph.forward)
    """
)

# What the models read: VARIANT "a" in the cold process, "b" in the warm one.
LIBRARY = textwrap.dedent(
    """
    import os

    FLAG = os.environ["VARIANT"] == "a"
    """
)

MODELS = textwrap.dedent(
    """
    import json, logging, os, sys, types
    import torch
    import torch._dynamo.convert_frame as convert_frame
    from torch import nn
    import warm_library
    from slotwise.compilation import CompilationConfig, support_torch_compile
    from slotwise.compilation import compile as slotwise_compile

    logging.basicConfig()
    logging.getLogger("slotwise").setLevel(logging.INFO)
    B = os.environ["VARIANT"] == "b"
    SCALE = 3.0 if B else 2.0
    SHIFTS = {"shift": 0.5 if B else 0.25}


    def make_scaler(factor):
        def scaled(x):
            return x * factor
        return scaled


    scaled = make_scaler(-1.0 if B else 1.0)


    def add_bias(x, bias=0.75 if B else 0.5):
        return x + bias


    class HFStyleConfig:
        def __init__(self, eps, gated):
            self.rms_norm_eps = eps
            self.gated = gated


    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)


    @support_torch_compile
    class ConfigNamespace(Base):
        def __init__(self, scale):
            super().__init__()
            self.config = types.SimpleNamespace(scale=scale)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * self.config.scale


    @support_torch_compile
    class ConfigObject(Base):
        def __init__(self):
            super().__init__()
            self.config = HFStyleConfig(1e-1 if B else 1e-6, gated=not B)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.proj(x)
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
            return torch.sigmoid(y) * y if self.config.gated else y


    @support_torch_compile
    class ModuleGlobal(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * SCALE


    @support_torch_compile
    class OtherModuleGlobal(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) + 1 if warm_library.FLAG else self.proj(x) - 1


    @support_torch_compile
    class ClassAttribute(Base):
        factor = 4.0 if B else 2.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * self.factor


    @support_torch_compile
    class ClosureVariable(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scaled(self.proj(x))


    @support_torch_compile
    class DictValue(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) + SHIFTS["shift"]


    @support_torch_compile
    class DefaultArgument(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return add_bias(self.proj(x))


    @support_torch_compile
    class SubmoduleHook(Base):
        def __init__(self):
            super().__init__()
            if B:
                self.proj.register_forward_hook(lambda module, args, out: out * 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)


    @support_torch_compile
    class TensorAttributeSize(Base):
        def __init__(self):
            super().__init__()
            self.mask = torch.ones(6 if B else 4)  # a plain attribute, not a buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * self.mask.shape[0]


    @support_torch_compile
    class TiedWeights(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(tie_word_embeddings=not B)
            self.embed = nn.Embedding(16, 8)
            self.head = nn.Linear(8, 16, bias=False)
            if self.config.tie_word_embeddings:
                self.head.weight = self.embed.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(x))


    def enclosing_scope_model(scale):
        @support_torch_compile
        class EnclosingScope(Base):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.proj(x) * scale

        return EnclosingScope


    class SizeFactor(Base):  # compiled by slotwise.compile, its sizes declared there
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * x.shape[0]


    @support_torch_compile
    class Unchanged(Base):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * 2


    traces = []
    trace_frame = convert_frame.trace_frame


    def counting_trace_frame(*args, **kwargs):
        traces.append(1)
        return trace_frame(*args, **kwargs)


    convert_frame.trace_frame = counting_trace_frame
    config = CompilationConfig(
        level=3, backend="warm_eager:PersistentEager", cache_dir=sys.argv[1]
    )


    def run(name, build, sizes=(3, 5)):
        torch.manual_seed(0)
        model = build()
        forward = type(model).forward
        forward = getattr(forward, "__wrapped__", forward)  # undecorated: eager
        before = len(traces)
        out, eager = [], []
        for size in sizes:
            if isinstance(model, TiedWeights):
                x = torch.arange(size) % 16
            else:
                x = torch.randn(size, 8, generator=torch.Generator().manual_seed(size))
            out.append(model(x).tolist())
            eager.append(forward(model, x).tolist())
        report[name] = {"out": out, "eager": eager, "traces": len(traces) - before}


    report = {}
    run("config namespace", lambda: ConfigNamespace(3.0 if B else 2.0, compilation_config=config))
    if not B:  # a second instance in the cold process, other constant, same structure
        run("second instance", lambda: ConfigNamespace(5.0, compilation_config=config))
    for cls in (
        ConfigObject, ModuleGlobal, OtherModuleGlobal, ClassAttribute, ClosureVariable,
        DictValue, DefaultArgument, SubmoduleHook, TensorAttributeSize, TiedWeights, Unchanged,
    ):
        run(cls.__name__, lambda: cls(compilation_config=config))
    EnclosingScope = enclosing_scope_model(3.0 if B else 2.0)
    run("EnclosingScope", lambda: EnclosingScope(compilation_config=config))
    # Cold: x's size declared static (so called with one size only); warm: dynamic.
    run(
        "dynamic_arg_dims",
        lambda: slotwise_compile(SizeFactor(), config, dynamic_arg_dims=None if B else {}),
        sizes=(3, 5) if B else (3,),
    )
    if B:  # last: a global hook reaches every module called after it
        torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, out: out * 2 if isinstance(module, nn.Linear) else out
        )
    run("global module hook", lambda: Unchanged(compilation_config=config))
    print(json.dumps(report))
    """
)

CHANGED = [
    "config namespace",
    "ConfigObject",
    "ModuleGlobal",
    "OtherModuleGlobal",
    "ClassAttribute",
    "ClosureVariable",
    "DictValue",
    "DefaultArgument",
    "SubmoduleHook",
    "TensorAttributeSize",
    "TiedWeights",
    "EnclosingScope",
    "dynamic_arg_dims",
    "global module hook",
]


def write_scripts(folder: Path) -> None:
    (folder / "warm_eager.py").write_text(PERSISTENT_EAGER)
    (folder / "warm_library.py").write_text(LIBRARY)
    (folder / "warm_models.py").write_text(MODELS)


def run_models(folder: Path, variant: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(folder / "warm_models.py"), str(folder / "cache")],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(VARIANT=variant),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for outcome in report.values():
        outcome["log"] = result.stderr
    return report


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict, Path]:
    """The cold process (variant a) fills the cache; the warm one (variant b) reuses it."""
    folder = tmp_path_factory.mktemp("warm_exact")
    write_scripts(folder)
    return run_models(folder, "a"), run_models(folder, "b"), folder


def assert_eager(outcome: dict) -> None:
    for got, expected in zip(outcome["out"], outcome["eager"], strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected))


@pytest.mark.parametrize("model", CHANGED)
def test_a_warm_process_computes_what_eager_computes_on_its_changed_model(runs, model):
    cold, warm, _ = runs
    assert_eager(cold[model])
    assert_eager(warm[model])


def test_a_second_instance_with_another_constant_does_not_reuse_the_first_trace(runs):
    cold, _, _ = runs
    assert_eager(cold["second instance"])


def test_a_model_nothing_changed_in_is_rebuilt_without_dynamo(runs):
    cold, warm, _ = runs
    assert cold["Unchanged"]["traces"] == 1
    assert warm["Unchanged"]["traces"] == 0, warm["Unchanged"]["log"]
    assert_eager(warm["Unchanged"])


DISTRIBUTED = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from slotwise.compilation import CompilationConfig, support_torch_compile


    @support_torch_compile
    class RankOffset(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # Dynamo folds the rank and world size into the graph without a guard.
            return self.proj(x) + 10 * dist.get_rank() + dist.get_world_size()


    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = CompilationConfig(
        level=3, backend="warm_eager:PersistentEager", cache_dir=sys.argv[1]
    )
    model = RankOffset(compilation_config=config)
    x = torch.randn(3, 8)
    if rank == 0:
        out = model(x)  # traces and saves the entry
    dist.barrier()
    if rank == 1:
        out = model(x)  # finds rank 0's entry
    dist.barrier()
    eager = type(model).forward.__wrapped__(model, x)
    print(json.dumps({"out": [out.tolist()], "eager": [eager.tolist()]}))
    dist.destroy_process_group()
    """
)


def test_another_rank_does_not_reuse_a_trace_with_the_first_ranks_number_baked_in(tmp_path):
    (tmp_path / "warm_eager.py").write_text(PERSISTENT_EAGER)
    script = tmp_path / "rank_model.py"
    script.write_text(DISTRIBUTED)
    port = free_port()
    commands = [
        ([sys.executable, str(script), str(tmp_path / "cache")], torchrun_env(rank, 2, port))
        for rank in (0, 1)
    ]
    for rank, finished in enumerate(run_together(commands, timeout=300)):
        assert finished.returncode == 0, finished.stderr
        assert_eager(json.loads(finished.stdout.strip().splitlines()[-1])), f"rank {rank}"


def test_an_entry_another_user_could_have_written_is_not_used(runs):
    _, warm, folder = runs
    assert warm["Unchanged"]["traces"] == 0  # its entry was used while it was private
    entries = list((folder / "cache").glob("*/dynamo-trace-*.bin"))
    assert entries
    for entry in entries:
        entry.chmod(entry.stat().st_mode | stat.S_IWGRP)
    again = run_models(folder, "b")
    assert again["Unchanged"]["traces"] == 1
    assert "not trusted" in again["Unchanged"]["log"]
    assert_eager(again["Unchanged"])


def test_a_trace_depending_on_what_cannot_be_checked_is_not_saved_and_the_log_says_why(runs):
    cold, warm, _ = runs
    # The class reads `scale` from the function that made it: no path reaches that.
    reason = "EnclosingScope is not saved (the trace reads L['scale']"
    assert cold["EnclosingScope"]["log"].count(reason) == 1
    assert warm["EnclosingScope"]["traces"] == 1
