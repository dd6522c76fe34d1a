"""TP=2 greedy generation under torchrun gives the tokens of a single process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import torchrun

from slotwise_engine.models.llama import PRESETS

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tensor_parallel.py"


@pytest.mark.slow
@pytest.mark.parametrize("level_flags", [["-O0"], ["-O.backend=eager"]], ids=["level0", "level3"])
def test_tensor_parallel_tokens_match_a_single_process(level_flags):
    result = torchrun(
        str(EXAMPLE), "--tp", "2", "--json", *level_flags,
        SLOTWISE_DIST_TIMEOUT="120", SLOTWISE_DISABLE_COMPILE_CACHE="1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["tp"] == 2
    assert report["heads_per_rank"] == PRESETS["tiny"].num_heads // 2
    assert report["matches_single_process"] is True
    assert all(len(tokens) == 6 for tokens in report["tokens"])


@pytest.mark.slow
def test_bench_runs_under_torchrun_with_tensor_parallelism():
    result = torchrun(
        "-m", "slotwise", "bench", "--tp", "2", "--preset", "tiny", "--batch-sizes", "2",
        "--iterations", "2", "--variants", "eager,level3", "-O.backend=eager", "--json",
        SLOTWISE_DIST_TIMEOUT="120", SLOTWISE_DISABLE_COMPILE_CACHE="1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    report = json.loads(result.stdout)  # rank 0 alone prints
    assert report["tensor_parallel_size"] == 2
    assert {m["variant"] for m in report["measurements"]} == {"eager", "level3"}
    assert all(m["max_abs_logit_diff"] < 1e-4 for m in report["measurements"])
