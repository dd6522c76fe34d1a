"""Warm starts seen by a user: a second process runs the model without a Dynamo trace and
gives the cold run's outputs; anything that could change the trace makes it trace again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support import clean_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, logging, sys
    import torch
    logging.basicConfig(level=logging.INFO)
    if sys.argv[4] != "-":
        torch.__version__ = sys.argv[4]  # simulate another torch release
    from torch import nn
    from slotwise.compilation import CompilationConfig, counters, support_torch_compile
    from slotwise.testing.toy_models import TOY_SPLITTING_OPS, attend

    traces = []
    if sys.argv[5] == "count-traces":  # imports Dynamo before slotwise compiles anything
        import torch._dynamo.convert_frame as convert_frame
        trace_frame = convert_frame.trace_frame
        def counting_trace_frame(*args, **kwargs):
            traces.append(1)
            return trace_frame(*args, **kwargs)
        convert_frame.trace_frame = counting_trace_frame

    @support_torch_compile
    class Model(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = attend(layer(x), x, x) * SCALE
            return x

    config = CompilationConfig(
        level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS,
        cache_dir=sys.argv[1], compile_sizes=json.loads(sys.argv[2]),
    )
    outputs = []
    for seed in (0, 1):  # a second weight set through the same cache
        torch.manual_seed(seed)
        model = Model(int(sys.argv[3]), compilation_config=config)
        for size in (1, 0, 2, 5):  # first call of size 1
            x = torch.randn(size, 16, generator=torch.Generator().manual_seed(size))
            outputs.append(model(x).tolist())
    print(json.dumps({"counters": counters.snapshot(), "traces": len(traces), "out": outputs}))
    """
)


def run(
    tmp_path: Path,
    scale="2",
    compile_sizes="[]",
    layers="3",
    torch_version="-",
    env: dict[str, str] | None = None,
    count_traces: bool = True,
) -> dict:
    script = tmp_path / f"model_{scale}.py"
    script.write_text(SCRIPT.replace("SCALE", scale))
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / "cache"),
            compile_sizes,
            layers,
            torch_version,
            "count-traces" if count_traces else "-",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env or clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["log"] = result.stderr
    return report


def eager_reference(scale: float, layers: int) -> list:
    """The same model run eagerly in this process, as the oracle for every run."""
    from torch import nn

    from slotwise.testing.toy_models import attend

    outputs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        linears = [nn.Linear(16, 16) for _ in range(layers)]
        for size in (1, 0, 2, 5):
            x = torch.randn(size, 16, generator=torch.Generator().manual_seed(size))
            for layer in linears:
                x = attend(layer(x), x, x) * scale
            outputs.append(x)
    return outputs


def assert_outputs(report: dict, scale: float = 2.0, layers: int = 3) -> None:
    for got, expected in zip(report["out"], eager_reference(scale, layers), strict=True):
        torch.testing.assert_close(torch.tensor(got).reshape(expected.shape), expected)


def test_warm_process_runs_no_dynamo_trace_and_gives_the_cold_outputs(tmp_path):
    cold = run(tmp_path)
    # The second instance (other weights) already loads what the first one saved.
    assert cold["traces"] == 1
    assert_outputs(cold)

    warm = run(tmp_path)
    assert warm["traces"] == 0, warm["log"]
    assert warm["counters"]["num_graphs_seen"] == 0
    assert warm["counters"]["num_inductor_compiles"] == 0
    assert warm["out"] == cold["out"]
    assert "rebuilt from its saved trace" in warm["log"]


def test_kernels_kept_across_a_reboot_and_apart_for_another_vector_isa(tmp_path):
    # Inductor's default cache is under the system's temporary folder, which a reboot
    # empties; slotwise keeps it in its own cache unless TORCHINDUCTOR_CACHE_DIR is set.
    system_tmp = tmp_path / "system-tmp"

    def environment(**extra: str) -> dict[str, str]:
        system_tmp.mkdir(exist_ok=True)
        env = clean_env(TMPDIR=str(system_tmp), **extra)
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        return env

    # As a user's script: nothing imports Dynamo before slotwise compiles.
    cold = run(tmp_path, env=environment(), count_traces=False)
    kernels = sorted(path.name for path in (tmp_path / "cache").rglob("*.so"))
    assert kernels, "Inductor's compiled kernels are not in slotwise's cache folder"
    shutil.rmtree(system_tmp)  # the reboot
    warm = run(tmp_path, env=environment(), count_traces=False)
    assert warm["counters"]["num_graphs_seen"] == 0, warm["log"]  # no Dynamo trace
    assert warm["counters"]["num_inductor_compiles"] == 0
    assert warm["out"] == cold["out"]
    assert sorted(path.name for path in (tmp_path / "cache").rglob("*.so")) == kernels
    assert not list(system_tmp.rglob("*.so")), "kernels were compiled again"

    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return  # this CPU picks one vector ISA only
    # The cache seen from a machine that picks AVX2 (a home folder on NFS, a copied
    # cache): Inductor's AVX-512 code loaded there computes wrong numbers.
    elsewhere = run(tmp_path, env=environment(ATEN_CPU_CAPABILITY="avx2"), count_traces=False)
    assert elsewhere["counters"]["num_inductor_compiles"] > 0  # compiled for that CPU
    assert_outputs(elsewhere)


def test_every_change_that_could_alter_the_trace_traces_again(tmp_path):
    run(tmp_path)  # fills the caches
    for changed, kwargs in (
        ("model source", {"scale": "3"}),
        ("config", {"compile_sizes": "[5]"}),
        ("torch version", {"torch_version": "9.9.9"}),
        ("module structure", {"layers": "4"}),
    ):
        report = run(tmp_path, **kwargs)
        assert report["traces"] == 1, changed
        assert_outputs(report, float(kwargs.get("scale", 2)), int(kwargs.get("layers", 3)))
    assert run(tmp_path)["traces"] == 0  # the original entry is still there and valid


def test_a_corrupt_trace_entry_warns_traces_and_is_rewritten(tmp_path):
    run(tmp_path)
    (entry,) = (tmp_path / "cache").glob("*/dynamo-trace-*.bin")
    entry.write_bytes(entry.read_bytes()[:100])
    damaged = run(tmp_path)
    assert "corrupt or truncated" in damaged["log"]
    assert damaged["traces"] == 1
    assert_outputs(damaged)
    assert run(tmp_path)["traces"] == 0


def test_switched_off_by_the_environment(tmp_path):
    run(tmp_path)
    script = tmp_path / "model_2.py"
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache"), "[]", "3", "-", "count-traces"],
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_env(
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), SLOTWISE_DISABLE_WARM_START="1"
        ),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["traces"] == 2
