"""`slotwise bench`, the main job, on the tiny preset."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from support import clean_env

from slotwise import decode_benchmark
from slotwise.compilation.config import ENV_CONFIG, CompilationConfig

# The module: the package slotwise.cli exports its main() under the same name.
cli_main = importlib.import_module("slotwise.cli.main")


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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--iterations", "0"], "argument --iterations: expected an integer >= 1, got '0'"),
        (["--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
        (["--prompt-len", "-4"], "argument --prompt-len: expected an integer >= 1, got '-4'"),
        (["--tp", "0"], "argument --tp: expected an integer >= 1, got '0'"),
        (["--tp", "-2"], "argument --tp: expected an integer >= 1, got '-2'"),
        (["--batch-sizes", "1,x"], "argument --batch-sizes: '1,x' must list positive integers"),
    ],
)
def test_bench_refuses_bad_numbers_when_parsing(args, message):
    result = bench(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_bench_refuses_a_bad_environment_config_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "bench", "--preset", "tiny"],
        capture_output=True,
        text=True,
        env=clean_env(SLOTWISE_COMPILATION_CONFIG='{"level": 9}'),
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("slotwise bench: error: SLOTWISE_COMPILATION_CONFIG: ")
    assert "'level'" in result.stderr and result.stderr.count("\n") == 1


class BenchmarkStarted(Exception):
    """run_benchmark was reached, with the config it got: every check before it passed."""


@pytest.fixture
def bench_main(monkeypatch) -> Callable[..., int]:
    """main() of `slotwise bench` in this process, stopped where the benchmark starts."""

    def started(preset: str, batch_sizes: list[int], base: CompilationConfig, **_: Any) -> None:
        raise BenchmarkStarted(base)

    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)
    monkeypatch.setattr(decode_benchmark, "run_benchmark", started)
    return lambda *args: cli_main.main(["bench", "--preset", "tiny", *args])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt-len", "512"], "argument --prompt-len: preset tiny holds prompts of 1 to 511"),
        (["--preset", "huge"], "argument --preset: unknown preset 'huge'; choose one of tiny"),
    ],
)
def test_bench_checks_the_preset_before_any_work(bench_main, capsys, args, message):
    assert bench_main(*args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("source", ["json", "file"])
def test_bench_lays_o_flags_over_the_environment_config(bench_main, monkeypatch, tmp_path, source):
    text = '{"backend": "eager", "graph_warmups": 3}'
    if source == "file":
        (tmp_path / "compile.json").write_text(text)
        text = str(tmp_path / "compile.json")
    monkeypatch.setenv(ENV_CONFIG, text)
    with pytest.raises(BenchmarkStarted) as started:
        bench_main("-O.graph_warmups=2")
    (config,) = started.value.args
    assert (config.backend, config.graph_warmups) == ("eager", 2)
