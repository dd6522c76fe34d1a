"""The GPU check script and benchmark: a clear refusal without graphs, a dry run with the
stub NPU's simulated graphs, so that the script is known to work before a GPU runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_gpu_benchmark_runs_on_simulated_graphs(tmp_path):
    env = clean_env(SLOTWISE_PLATFORM="ascend_stub", SLOTWISE_ASCEND_STUB_DEVICES="1")
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_decode.py"), "--preset", "tiny"]
    command += ["--backend", "eager", "--iterations", "2", "--batch-sizes", "1,4"]
    command += ["--variants", "eager,level3+graphs,level3+full_graphs", "--out-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "gpu_decode.json").read_text())
    measured = {(m["variant"], m["batch_size"]) for m in report["measurements"]}
    assert measured == {
        (variant, batch)
        for variant in ("eager", "level3+graphs", "level3+full_graphs")
        for batch in (1, 4)
    }
    assert all(m["max_abs_logit_diff"] < 0.05 for m in report["measurements"])
    assert [note.split(":")[0] for note in report["notes"]] == [
        "piecewise vs eager at batch 1",
        "piecewise capture per size",
        "full graphs capture per size",
        "piecewise vs full graphs at batch 1",
    ]
    assert (tmp_path / "gpu_decode.md").read_text().startswith("GPU decode step, preset tiny")


def test_gpu_check_script_is_valid_bash():
    script = ROOT / "tests" / "gpu" / "run_gpu_checks.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
