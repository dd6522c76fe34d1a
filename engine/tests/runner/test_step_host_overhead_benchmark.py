"""benchmarks/step_host_overhead.py end to end on the tiny preset: short runs in both graph
modes that report every phase, the reference loop and the ratio (no timing is asserted).
The bfloat16 runs with the real LM head take the path ``--device cuda`` takes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import clean_env

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "step_host_overhead.py"
LAYERS = 2  # the tiny preset's
COMMON_PHASES = {
    "runner: step inputs",
    "runner: input write",
    "runner: input upload",
    "runner: metadata build",
    # Decode steps of a captured size run as a recorded list of calls, past the model
    # call, its entry and the graph wrappers.
    "recorded step",
    "graph replay",
    "sampling",
}
#: A recorded step calls each layer's bound attention calls, past the op, with nothing
#: looked up, checked or bound again while the step's shape stays.
PIECEWISE_PHASES = COMMON_PHASES | {"attention: kv write", "attention: launch"}
#: Attention runs inside the one graph; the runner lays out the metadata it reads.
FULL_PHASES = COMMON_PHASES


def run_benchmark(tmp_path: Path, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--rounds", "1", "--steps", "2",
         "--out-dir", str(tmp_path), "--json", *args],
        capture_output=True, text=True, timeout=300, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_the_cuda_branch_names_the_platform_it_needs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda", "--preset", "tiny",
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=clean_env(),
    )  # fmt: skip
    assert result.returncode != 0
    assert "--device cuda needs the cuda platform with CUDA graphs, not cpu" in result.stderr


def assert_ratio_of_medians(report: dict) -> None:
    assert report["step_us"]["median"] > 0 and report["reference_us"]["median"] > 0
    assert report["ratio"] == pytest.approx(
        report["step_us"]["median"] / report["reference_us"]["median"], rel=0.01
    )


@pytest.mark.slow
@pytest.mark.parametrize("batch, dtype, lm_head", [(1, "float32", "null"), (4, "bfloat16", "real")])
def test_piecewise_steps_report_every_phase_and_the_reference(tmp_path, batch, dtype, lm_head):
    report = run_benchmark(tmp_path, "--batch", str(batch), "--dtype", dtype, "--lm-head", lm_head)
    assert report["graph_mode"] == "PIECEWISE" and not report["full_graph_step"]
    assert (report["batch"], report["dtype"], report["lm_head"]) == (batch, dtype, lm_head)
    assert report["num_layers"] == LAYERS
    assert set(report["phases_us_per_step"]) == PIECEWISE_PHASES
    assert set(report["phases_us_per_layer"]) == {
        p for p in PIECEWISE_PHASES if p.startswith("attention")
    }
    # Two input copies, a replay per piece, per layer a KV write and a launch, then sampling.
    assert report["reference_calls_per_step"] == 2 + (LAYERS + 1) + 2 * LAYERS + 1
    assert report["target_ratio"] == 1.3
    assert_ratio_of_medians(report)
    md = (tmp_path / "step_host_overhead.md").read_text()
    assert md.startswith("Host time of a decode step under PIECEWISE")


@pytest.mark.slow
@pytest.mark.parametrize("batch, dtype, lm_head", [(8, "bfloat16", "real"), (3, "float32", "null")])
def test_full_and_piecewise_decodes_replay_one_graph(tmp_path, batch, dtype, lm_head):
    report = run_benchmark(
        tmp_path, "--graph-mode", "FULL_AND_PIECEWISE", "--batch", str(batch),
        "--dtype", dtype, "--lm-head", lm_head,
    )  # fmt: skip
    assert report["graph_mode"] == "FULL_AND_PIECEWISE" and report["full_graph_step"]
    assert set(report["phases_us_per_step"]) == FULL_PHASES
    assert report["phases_us_per_layer"] == {}
    # Two input copies, two metadata copies (sequence lengths, slots), one replay, sampling.
    assert report["reference_calls_per_step"] == 2 + 2 + 1 + 1
    assert report["target_ratio"] == 1.1
    assert_ratio_of_medians(report)
