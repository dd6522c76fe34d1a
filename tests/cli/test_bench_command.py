"""`slotwise bench`, the main job, on the tiny preset."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import clean_env


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotwise", "bench", "--preset", "tiny", *args],
        capture_output=True,
        text=True,
        env=clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1"),
        timeout=600,
    )


def test_bench_json_reports_every_variant_and_batch_size():
    result = bench(
        "--batch-sizes",
        "1,2",
        "--iterations",
        "3",
        "--variants",
        "eager,level3",
        "-O.backend=eager",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["platform"] == "cpu" and report["preset"] == "tiny"
    rows = {(m["variant"], m["batch_size"]): m for m in report["measurements"]}
    assert set(rows) == {("eager", 1), ("eager", 2), ("level3", 1), ("level3", 2)}
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p90_ms"]
        assert row["tokens_per_second"] > 0
        # The eager compiler runs the same ops: logits agree to float rounding.
        assert row["max_abs_logit_diff"] < 1e-4
    assert rows[("eager", 1)]["speedup_vs_eager"] == 1.0


def test_bench_table_is_the_default_output():
    result = bench("--batch-sizes", "1", "--iterations", "2", "--variants", "eager")
    assert result.returncode == 0, result.stderr
    assert "p50 ms" in result.stdout and "eager" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variants", "warp"], "unknown variants ['warp']"),
        (["--variants", "level3+graphs"], "needs static graphs"),
        (["--batch-sizes", "0"], "must list positive integers"),
        (["-O.levle=3"], "did you mean 'level'"),
    ],
)
def test_bench_rejects_bad_arguments_with_the_reason(args, message):
    result = bench("--iterations", "1", *args)
    assert result.returncode != 0
    assert message in result.stderr
