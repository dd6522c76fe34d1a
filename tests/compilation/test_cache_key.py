"""What keys the compile cache: each named factor group (versions, config, traced code,
compiler, device) moves a model to another cache folder, and nothing else does; Inductor's
folder follows the device only."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from support import clean_env
from test_device_identity_keys import VendorPlatform

from slotwise.compilation.cache import cache_key
from slotwise.compilation.cache.compile_cache import FACTORS_FILE, CompileCache
from slotwise.compilation.compilers import EagerCompiler
from slotwise.compilation.config import CompilationConfig
from slotwise.platforms import get_current_platform, use_platform

GROUPS = {"versions", "config", "traced_code", "compiler", "device"}


class OtherEagerCompiler(EagerCompiler):
    """Another compiler class, with the same (empty) settings."""


def folder(
    tmp_path: Path, compiler_cls: type[EagerCompiler] = EagerCompiler, model: str = "m", **config
) -> str:
    cfg = CompilationConfig(level=3, backend="eager", cache_dir=str(tmp_path), **config)
    return CompileCache(cfg, compiler_cls(cfg), factors={"model": model}).directory


def both_keys(tmp_path: Path, **config: Any) -> tuple[str, str]:
    """The compile cache's folder and Inductor's folder key, as they are now."""
    return folder(tmp_path, **config), cache_key.folder_key(cache_key.inductor_folder_factors())


def test_the_same_model_gets_the_same_folders(tmp_path):
    assert both_keys(tmp_path) == both_keys(tmp_path)


def test_runtime_only_settings_move_no_folder(tmp_path):
    assert both_keys(tmp_path, graph_warmups=5, debug_checks=True) == both_keys(tmp_path)


def test_versions_key_the_cache(tmp_path, monkeypatch):
    before = folder(tmp_path)
    monkeypatch.setattr(torch, "__version__", "0.0.1-other")
    assert folder(tmp_path) != before


def test_the_config_keys_the_cache_not_inductors_folder(tmp_path):
    cache, inductor = both_keys(tmp_path)
    other_cache, other_inductor = both_keys(tmp_path, compile_sizes=[4])
    assert other_cache != cache
    assert other_inductor == inductor


def test_the_traced_code_keys_the_cache_not_inductors_folder(tmp_path):
    before = cache_key.folder_key(cache_key.inductor_folder_factors())
    assert folder(tmp_path, model="n") != folder(tmp_path, model="m")
    assert cache_key.folder_key(cache_key.inductor_folder_factors()) == before


def test_the_compiler_keys_the_cache(tmp_path):
    assert folder(tmp_path, OtherEagerCompiler) != folder(tmp_path)


@pytest.mark.parametrize("how", ["identity", "vector_isa"])
def test_the_device_keys_the_cache_and_inductors_folder(tmp_path, monkeypatch, how):
    with use_platform(VendorPlatform("1")):
        before = both_keys(tmp_path)
    if how == "identity":
        with use_platform(VendorPlatform("2")):
            after = both_keys(tmp_path)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
        with use_platform(VendorPlatform("1")):
            after = both_keys(tmp_path)
    assert after[0] != before[0]
    assert after[1] != before[1]


def test_each_factor_sits_in_one_group():
    config = CompilationConfig(level=3, backend="eager")
    factors = cache_key.directory_factors(config, EagerCompiler(config), {"model": "m"})
    assert set(factors) == GROUPS
    assert factors["versions"]["torch"] == torch.__version__
    assert factors["device"]["platform"] == get_current_platform().name
    assert cache_key.inductor_folder_factors() == {"device": factors["device"]}


# --- through a model, across processes ---------------------------------------------------

COMPILER = textwrap.dedent(
    """
    import pickle
    from pathlib import Path
    from slotwise.compilation.compilers import CompiledPiece, EagerCompiler

    class SavingCompiler(EagerCompiler):
        # The eager compiler, saving each piece as a pickled graph.
        supports_persistence = True
        compiles = 0

        def compile(self, graph, example_inputs, *, runtime_shape):
            type(self).compiles += 1
            save = lambda path: Path(path).write_bytes(pickle.dumps(graph))
            return CompiledPiece(fn=graph.forward, save=save)

        def load(self, path, graph, example_inputs, *, runtime_shape):
            return pickle.loads(Path(path).read_bytes()).forward
    """
)

MODEL = textwrap.dedent(
    """
    import json, sys
    import torch
    change = json.loads(sys.argv[2])
    if "torch" in change:
        torch.__version__ = change["torch"]  # another torch release
    from torch import nn
    from slotwise.compilation import CompilationConfig, support_torch_compile
    from slotwise.platforms import get_current_platform
    from saving_compiler import SavingCompiler

    if "generation" in change:  # another device of the same platform
        platform = get_current_platform()
        identity = platform.device_identity()
        platform.device_identity = lambda **kwargs: {**identity, "gen": change["generation"]}

    @support_torch_compile
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)) * SCALE

    config = CompilationConfig(
        level=2, backend="saving_compiler:SavingCompiler", cache_dir=sys.argv[1],
        compile_sizes=change.get("compile_sizes", []),
    )
    torch.manual_seed(0)
    out = Model(compilation_config=config)(torch.randn(3, 8))
    print(json.dumps({"compiles": SavingCompiler.compiles, "out": out.tolist()}))
    """
)


def run_model(tmp_path: Path, scale: str = "2.0", **change: Any) -> dict[str, Any]:
    """A fresh process compiling the model through the cache in ``tmp_path``."""
    (tmp_path / "saving_compiler.py").write_text(COMPILER)
    script = tmp_path / f"model_{scale}.py"
    script.write_text(MODEL.replace("SCALE", scale))
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache"), json.dumps(change)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(PYTHONPATH=str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_warm_cache_hits_and_each_group_misses(tmp_path):
    cold = run_model(tmp_path)
    assert cold["compiles"] > 0
    warm = run_model(tmp_path)
    assert warm["compiles"] == 0
    assert warm["out"] == cold["out"]

    for changed in (
        run_model(tmp_path, scale="3.0"),  # the model's source
        run_model(tmp_path, compile_sizes=[3]),  # the config
        run_model(tmp_path, torch="0.0.1-other"),  # a version
        run_model(tmp_path, generation="2"),  # the device
    ):
        assert changed["compiles"] > 0
    folders = [path for path in (tmp_path / "cache").iterdir() if path.name != "inductor"]
    assert len(folders) == 5
    for path in folders:
        written = json.loads((path / FACTORS_FILE).read_text())
        assert set(written) == GROUPS
