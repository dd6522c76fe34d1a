"""The persistent compile cache seen by a user: a second process loads instead of compiling."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import clean_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    if len(sys.argv) > 3:
        torch.__version__ = sys.argv[3]  # simulate another torch release
    from torch import nn
    from slotwise.compilation import CompilationConfig, counters, support_torch_compile
    from slotwise.testing.toy_models import TOY_SPLITTING_OPS, attend

    @support_torch_compile
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = attend(layer(x), x, x) * SCALE
            return x

    config = CompilationConfig(
        level=3, backend="inductor", splitting_ops=TOY_SPLITTING_OPS,
        cache_dir=sys.argv[1], compile_sizes=json.loads(sys.argv[2]),
    )
    torch.manual_seed(0)
    model = Model(compilation_config=config)
    x = torch.randn(5, 16)
    start = time.perf_counter()
    out = model(x)
    elapsed = time.perf_counter() - start
    print(json.dumps({"counters": counters.snapshot(), "seconds": elapsed, "out": out.tolist()}))
    """
)


def run(tmp_path: Path, scale: str = "2", compile_sizes: str = "[]", *extra: str) -> dict:
    script = tmp_path / f"model_{scale}.py"
    script.write_text(SCRIPT.replace("SCALE", scale))
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache"), compile_sizes, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        # Inductor's own caches live in the test folder: the cold run is really cold.
        env=clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_second_process_loads_every_piece_and_changes_miss(tmp_path):
    cold = run(tmp_path)
    assert cold["counters"]["num_inductor_compiles"] > 0
    assert cold["counters"]["num_cache_misses"] > 0

    warm = run(tmp_path)
    assert warm["counters"]["num_inductor_compiles"] == 0
    assert warm["counters"]["num_cache_hits"] == warm["counters"]["num_backend_compilations"]
    assert warm["out"] == cold["out"]
    print(f"cold {cold['seconds']:.2f} s, warm {warm['seconds']:.2f} s")
    assert warm["seconds"] < cold["seconds"]

    for changed in (
        run(tmp_path, "2", "[5]"),  # another config
        run(tmp_path, "3"),  # edited model source
        run(tmp_path, "2", "[]", "9.9.9"),  # another torch
    ):
        assert changed["counters"]["num_cache_misses"] > 0
        assert changed["counters"]["num_inductor_compiles"] > 0
