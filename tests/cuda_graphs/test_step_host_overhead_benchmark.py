"""benchmarks/step_host_overhead.py end to end on the tiny preset: one short run that
reports every phase and the reference loop (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_host_overhead.py"
PHASES = {
    "runner: step inputs",
    "runner: metadata build",
    "model entry",
    "piece wrapper",
    "graph replay",
    "attention: op dispatch",
    "attention: op body",
    "attention: metadata",
    "attention: launch binding and checks",
    "attention: kv write",
    "attention: launch",
    "sampling",
}


@pytest.mark.slow
def test_the_benchmark_reports_every_phase_and_the_reference(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--rounds", "1", "--steps", "2",
         "--out-dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert set(report["phases_us_per_step"]) == PHASES
    assert set(report["phases_us_per_layer"]) == {p for p in PHASES if p.startswith("attention")}
    assert report["num_layers"] == 2 and report["batch"] == 1
    # Two input copies, three replays, per layer a KV write and a launch, then sampling.
    assert report["reference_calls_per_step"] == 2 + 3 + 2 * 2 + 1
    assert report["step_us"]["median"] > 0 and report["reference_us"]["median"] > 0
    assert report["ratio"] == pytest.approx(
        report["step_us"]["median"] / report["reference_us"]["median"], rel=0.01
    )
    assert (tmp_path / "step_host_overhead.md").read_text().startswith("Host time of a piecewise")
