"""benchmarks/serving.py end to end on the tiny preset: `slotwise serve` and `transformers
serve --continuous-batching` each started, driven at two request rates and stopped, with
every figure and the ratios in the report (no timing is asserted)."""

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
LATENCIES = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


@pytest.mark.slow
def test_both_servers_are_measured_at_every_rate(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--rates", ",".join(RATES),
         "--num-prompts", str(PROMPTS), "--input-len", "16", "--output-len", "6",
         "--warmup-requests", "1", "--out-dir", str(tmp_path), "--json",
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
        assert [run["rate"] for run in server["runs"]] == RATES
        for run in server["runs"]:
            assert (run["completed"], run["failed"]) == (PROMPTS, 0), (name, run["errors"])
            assert run["output_lengths_exact"], name
            assert run["output_tokens"] == report["settings"]["output_tokens_requested"]
            assert run["requests_per_s"] > 0 and run["output_tokens_per_s"] > 0
            for key in LATENCIES:
                assert set(run[key]) == {"p50", "p90", "p99"}, (name, key)
                assert run[key]["p50"] <= run[key]["p90"] <= run[key]["p99"]
    ratios = report["ratios"]
    assert [row["rate"] for row in ratios["per_rate"]] == RATES
    for row in ratios["per_rate"]:
        assert all(row[key] > 0 for key in ("output_tokens_per_s", "ttft_p90", "itl_p90"))
    assert ratios["saturation_output_tokens_per_s"] > 0
    markdown = (tmp_path / "serving.md").read_text()
    assert "slotwise ÷ transformers" in markdown
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "serving.png").read_bytes().startswith(b"\x89PNG")
        assert report["plot"] == str(tmp_path / "serving.png")
