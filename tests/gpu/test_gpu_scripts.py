"""The GPU check script and benchmark: a clear refusal without graphs, and a dry run of
the whole script on the stub NPU's simulated graphs, so that it is known to work before
a GPU machine, lent rarely and briefly, runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_names_the_platform_it_needs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_decode.py")],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert result.returncode != 0
    assert "gpu_decode needs a platform with static graphs (cuda), not cpu" in result.stderr


@pytest.mark.slow
def test_gpu_check_script_runs_end_to_end_on_simulated_graphs(tmp_path):
    # What a GPU machine runs, minus the GPU: a venv over this interpreter's packages, the
    # editable installs, the `cuda` tests (all skipped here) and the benchmark.
    env = clean_env(
        SLOTWISE_PLATFORM="ascend_stub",
        SLOTWISE_ASCEND_STUB_DEVICES="1",
        GPU_DECODE_ARGS="--preset tiny --backend eager --iterations 2 --batch-sizes 1,2 "
        "--variants eager,level3+graphs,level3+full_graphs",
        PYTHON=sys.executable,
        OUT=str(tmp_path),
    )
    script = ROOT / "tests" / "gpu" / "run_gpu_checks.sh"
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "platform ascend_stub: " in result.stdout  # `slotwise env`, run from the venv
    assert 'skipped="' in (tmp_path / "gpu_tests.xml").read_text()
    report = json.loads((tmp_path / "gpu_decode.json").read_text())
    measured = {(m["variant"], m["batch_size"]) for m in report["measurements"]}
    assert measured == {
        (variant, batch)
        for variant in ("eager", "level3+graphs", "level3+full_graphs")
        for batch in (1, 2)
    }
    assert all(m["max_abs_logit_diff"] < 0.05 for m in report["measurements"])
    assert [note.split(":")[0] for note in report["notes"]] == [
        "piecewise vs eager at batch 1",
        "piecewise capture per size",
        "full graphs capture per size",
        "piecewise vs full graphs at batch 1",
    ]
    assert (tmp_path / "gpu_decode.md").read_text().startswith("GPU decode step, preset tiny")
