"""benchmarks/serving.py end to end on the tiny preset: `slotwise serve` and `transformers
serve --continuous-batching` each started, driven at two request rates and one request at
a time, and stopped, with every figure and the ratios in the report; slotwise's engine
steps from its /metrics, set against the memory roofline (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving.py"
RATES = ["8", "inf"]
PROMPTS = 4
SERIAL = 2
LATENCIES = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


@pytest.mark.slow
def test_both_servers_are_measured_at_every_rate(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--rates", ",".join(RATES),
         "--num-prompts", str(PROMPTS), "--input-len", "16", "--output-len", "6",
         "--warmup-requests", "1", "--out-dir", str(tmp_path), "--json",
         "--sequential", str(SERIAL), "--roofline",
         # a small KV cache: transformers' warm-up is shorter
         "--transformers-args", "--cb-num-blocks 64 --cb-max-batch-tokens 256"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report == json.loads((tmp_path / "serving.json").read_text())
    assert set(report["servers"]) == {"slotwise", "transformers"}
    for name, server in report["servers"].items():
        assert "error" not in server, server["error"]
        assert server["exit_code"] is not None and server["startup_s"] > 0
        assert [run["rate"] for run in server["runs"]] == [*RATES, "serial"]
        for run in server["runs"]:
            count = SERIAL if run["rate"] == "serial" else PROMPTS
            assert (run["completed"], run["failed"]) == (count, 0), (name, run["errors"])
            assert run["output_lengths_exact"], name
            if run["rate"] != "serial":
                assert run["output_tokens"] == report["settings"]["output_tokens_requested"]
            assert ("engine_steps" in run) == (name == "slotwise")
            assert run["requests_per_s"] > 0 and run["output_tokens_per_s"] > 0
            for key in LATENCIES:
                assert set(run[key]) == {"p50", "p90", "p99"}, (name, key)
                assert run[key]["p50"] <= run[key]["p90"] <= run[key]["p99"]
    for run in report["servers"]["slotwise"]["runs"]:
        steps = run["engine_steps"]
        assert steps["decode"]["steps"] > 0 and steps["mixed"]["steps"] > 0
        assert 0 < steps["busy_fraction"] <= 1.0
        if run["rate"] == "serial":  # one request in flight: each step runs one
            assert steps["decode"]["mean_requests"] == 1.0
    roofline = report["roofline"]
    rates = [r for r in report["servers"]["slotwise"]["runs"] if r["rate"] != "serial"]
    saturated = max(rates, key=lambda run: run["output_tokens_per_s"])
    decode = saturated["engine_steps"]["decode"]
    assert roofline["saturation"]["decode_batch"] == decode["mean_requests"]
    assert roofline["saturation"]["decode_step_ms"] == decode["mean_step_ms"]
    assert roofline["saturation"]["roofline_ms"] > 0 and roofline["read_bandwidth_gb_s"] > 0
    assert roofline["serial"]["itl_over_decode_step"] > 0
    ratios = report["ratios"]
    assert [row["rate"] for row in ratios["per_rate"]] == [*RATES, "serial"]
    for row in ratios["per_rate"]:
        assert all(row[key] > 0 for key in ("output_tokens_per_s", "ttft_p90", "itl_p90"))
    assert ratios["saturation_output_tokens_per_s"] > 0
    markdown = (tmp_path / "serving.md").read_text()
    assert "slotwise ÷ transformers" in markdown
    assert "one request in flight" in markdown and "of the memory roofline" in markdown
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "serving.png").read_bytes().startswith(b"\x89PNG")
        assert report["plot"] == str(tmp_path / "serving.png")
