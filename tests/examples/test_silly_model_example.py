"""examples/silly_model.py runs and reports the counters of a two-split model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import clean_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "silly_model.py"


def test_silly_model_example_with_the_eager_compiler():
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "-O.backend=eager", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.rsplit("\n", 2)[0])
    assert report["counters"]["num_piecewise_graphs_seen"] == 5
    assert report["counters"]["num_piecewise_capturable_graphs_seen"] == 3
    # 3 general compiles, 3 more for compile size 4
    assert report["counters"]["num_backend_compilations"] == 6
    assert report["max_abs_error"] < 1e-4
    assert result.stdout.strip().endswith("OK")
