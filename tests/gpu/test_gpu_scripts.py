"""The GPU check script and benchmark: a clear refusal without graphs, and a dry run of
the whole script on the stub NPU's simulated graphs, so that it is known to work before
a GPU machine, lent rarely and briefly, runs it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


GRAPH_VARIANTS = ("eager", "level3+graphs", "level3+full_graphs")


@pytest.mark.slow
def test_gpu_check_script_runs_end_to_end_on_simulated_graphs(tmp_path):
    # What a GPU machine runs, minus the GPU: a venv over this interpreter's packages, the
    # editable installs, the `cuda` tests (all skipped here), both decode benchmarks and
    # the step-host-overhead benchmark, each on the tiny preset.
    decode = "--preset tiny --backend eager --iterations 2 --batch-sizes 1,2 --variants "
    decode += ",".join(GRAPH_VARIANTS)
    env = clean_env(
        SLOTWISE_PLATFORM="ascend_stub",
        SLOTWISE_ASCEND_STUB_DEVICES="1",
        GPU_DECODE_ARGS=decode,
        GPU_1B_ARGS=decode,
        STEP_HOST_OVERHEAD_ARGS="--device cpu --preset tiny --rounds 1 --steps 2",
        PYTHON=sys.executable,
        OUT=str(tmp_path),
    )
    script = ROOT / "tests" / "gpu" / "run_gpu_checks.sh"
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "platform ascend_stub: " in result.stdout  # `slotwise env`, run from the venv
    assert "graphs   FULL_AND_PIECEWISE by default: " in result.stdout
    assert 'skipped="' in (tmp_path / "gpu_tests.xml").read_text()
    assert "step_host_overhead failed" not in result.stdout
    assert json.loads((tmp_path / "step_host_overhead.json").read_text())
    for name in ("gpu_decode", "gpu_decode_1b"):
        report = json.loads((tmp_path / f"{name}.json").read_text())
        measured = {(m["variant"], m["batch_size"]) for m in report["measurements"]}
        assert measured == {(variant, batch) for variant in GRAPH_VARIANTS for batch in (1, 2)}
        assert all(m["max_abs_logit_diff"] < 0.05 for m in report["measurements"])
        assert all(m["roofline_fraction"] > 0 for m in report["measurements"])
        assert [note.split(":")[0] for note in report["notes"]] == [
            "default graph mode FULL_AND_PIECEWISE (level3+full_graphs)",
            "piecewise vs eager at batch 1",
            "piecewise capture per size",
            "full graphs capture per size",
            "default mode vs full graphs at batch 1",
            "full graphs at batch 1",
            "piecewise vs full graphs at batch 1",
        ]
        # Whole steps through ModelRunner.step beside the model's step alone.
        whole = {(row["variant"], row["batch_size"]): row for row in report["whole_steps"]}
        assert set(whole) == measured
        for m in report["measurements"]:
            row = whole[(m["variant"], m["batch_size"])]
            assert row["p50_ms"] > 0 and row["execute_p50_ms"] == m["p50_ms"]
            assert row["around_model_ms"] == pytest.approx(row["p50_ms"] - m["p50_ms"])
        markdown = (tmp_path / f"{name}.md").read_text()
        assert markdown.startswith("GPU decode step, preset tiny")
        assert "Whole decode steps through `ModelRunner.step`" in markdown
    for part in ("tests marked cuda", "gpu_decode, small", "step_host_overhead", "done"):
        assert f"== {part}" in result.stdout


def measurement(variant: str, batch: int, p50_ms: float, **extra: float) -> dict[str, Any]:
    return {
        "variant": variant,
        "batch_size": batch,
        "p50_ms": p50_ms,
        "speedup_vs_eager": 1.0,
        "capture_seconds": 0.1,
        "roofline_fraction": 0.0,
        **extra,
    }


def gpu_decode() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gpu_decode", ROOT / "benchmarks" / "gpu_decode.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look their module up
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_a_whole_step_decodes_the_same_position_again_and_again():
    # The whole-step timing runs a step many times on runners that hold blocks for one
    # decode step per request: each call takes its step back, so nothing grows.
    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.models.llama import build_llama
    from slotwise_engine.runner.model_runner import ModelRunner

    module = gpu_decode()
    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    block_size = model.config.block_size
    runner = ModelRunner(model, num_blocks=2 * -(-(module.PROMPT_LEN + 1) // block_size) + 1)
    step = module.WholeStep.prepare(runner, 2)
    state = [(list(r.tokens), r.num_cached) for r in step.requests]
    for _ in range(2 * block_size):  # more tokens than a request has blocks for
        assert step.timed() > 0
    assert [(list(r.tokens), r.num_cached) for r in step.requests] == state


@pytest.mark.parametrize(
    "piecewise_ms, fraction, piecewise_verdict, roofline_verdict",
    [(1.05, 0.7, "PASS", "PASS"), (1.2, 0.5, "FAIL", "FAIL")],
)
def test_the_notes_judge_the_1b_targets_from_the_measurements(
    piecewise_ms, fraction, piecewise_verdict, roofline_verdict
):
    result = {
        "preset": "1b",
        "default_graph_mode": {
            "mode": "FULL_AND_PIECEWISE",
            "variant": "level3+full_graphs",
            "reason": "why",
        },
        "measurements": [
            measurement("level3+graphs", 1, piecewise_ms),
            measurement("level3+full_graphs", 1, 1.0, roofline_fraction=fraction),
            measurement("torch.compile:reduce-overhead", 1, 1.3),
            measurement("level3+graphs", 8, 2.0),
            measurement("torch.compile:reduce-overhead", 8, 1.9),
        ],
    }
    notes = {note.split(":")[0]: note for note in gpu_decode().target_notes(result, 2)}
    assert notes["piecewise vs full graphs at batch 1"].endswith(
        f"(target <= 1.1x: {piecewise_verdict})"
    )
    assert notes["full graphs at batch 1"].endswith(f"(target >= 0.6: {roofline_verdict})")
    assert notes["default mode vs full graphs at batch 1"].endswith("PASS)")
    # Piecewise is slower than reduce-overhead at batch 8 only; full graphs everywhere faster.
    assert notes["level3+graphs vs reduce-overhead, slowest batch size (8)"].endswith("FAIL)")
    assert notes["level3+full_graphs vs reduce-overhead, slowest batch size (1)"].endswith("PASS)")
