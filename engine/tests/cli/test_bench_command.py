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

from slotwise.compilation.config import ENV_CONFIG, CompilationConfig
from slotwise_engine.bench import decode as decode_benchmark
from slotwise_engine.models.llama import PRESETS

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


def tiny_step_bytes(batch: int, prompt_len: int, element_size: int) -> int:
    """What one decode step of the tiny preset must read, from its shape alone: every
    weight (the embedding table only for the step's tokens; the LM head is not tied)
    and each request's keys and values, the new token's included, in every layer."""
    c = PRESETS["tiny"]
    head = c.hidden_size // c.num_heads
    layer = (
        c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * head  # qkv
        + c.num_heads * head * c.hidden_size  # o_proj
        + 3 * c.intermediate_size * c.hidden_size  # gate, up, down
        + 2 * c.hidden_size  # the two norms
    )
    weights = c.num_layers * layer + c.hidden_size + c.vocab_size * c.hidden_size
    embedding_rows = batch * c.hidden_size
    kv = c.num_layers * batch * (prompt_len + 1) * 2 * c.num_kv_heads * head
    return (weights + embedding_rows + kv) * element_size


def test_bench_compares_dtypes_against_the_memory_roofline():
    result = bench(
        "--batch-sizes", "1,3", "--prompt-len", "20", "--iterations", "3",
        "--variants", "eager,level3", "--dtype", "float32,bfloat16", "-O.backend=eager",
        "--threads", "1", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    bandwidth, after = report["read_bandwidth"], report["read_bandwidth_after"]
    assert bandwidth["bytes_per_second"] > 1e8 and bandwidth["threads"] == 1
    assert after["bytes_per_second"] > 1e8 and after["probe_bytes"] == bandwidth["probe_bytes"]
    assert report["dtype"] == "float32,bfloat16" and len(report["load_average"]) == 2
    rows = {(m["dtype"], m["variant"], m["batch_size"]): m for m in report["measurements"]}
    assert len(rows) == 8
    for (dtype, _, batch), row in rows.items():
        size = 4 if dtype == "float32" else 2
        assert row["bytes_per_step"] == tiny_step_bytes(batch, 20, size)
        expected_ms = row["bytes_per_step"] / bandwidth["bytes_per_second"] * 1e3
        assert row["roofline_ms"] == pytest.approx(expected_ms)
        assert row["roofline_fraction"] == pytest.approx(row["roofline_ms"] / row["p50_ms"])
        if dtype == "float32":
            assert row["max_abs_logit_diff_vs_float32"] == row["max_abs_logit_diff"] < 1e-4
        else:  # bfloat16 rounding, far below the logits' spread, but not float32 noise
            assert 1e-4 < row["max_abs_logit_diff_vs_float32"] < 0.05
    table = bench("--batch-sizes", "1", "--iterations", "1", "--variants", "eager",
                  "--dtype", "bfloat16", "--threads", "1")  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "of roofline" in table.stdout and "bfloat16" in table.stdout
    assert "read bandwidth" in table.stdout and "GB/s after the steps" in table.stdout


def test_bench_table_is_the_default_output():
    result = bench("--batch-sizes", "1", "--iterations", "2", "--variants", "eager")
    assert result.returncode == 0, result.stderr
    assert "p50 ms" in result.stdout and "eager" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variants", "warp"], "unknown variants ['warp']"),
        (["--variants", "level3+graphs"], "needs static graphs"),
        (["--batch-sizes", "0"], "must list integers from 1 to 65536"),
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
        (["--iterations", "0"], "argument --iterations: expected an integer from 1 to 1000000"),
        (["--iterations", "9" * 30], "argument --iterations: expected an integer from 1 to"),
        (["--threads", "0"], "argument --threads: expected an integer from 1 to"),
        # torch.set_num_threads takes 100000, then crashes the process at exit
        (["--threads", "100000"], "argument --threads: expected an integer from 1 to"),
        (["--prompt-len", "-4"], "argument --prompt-len: expected an integer from 1 to"),
        (["--tp", "0"], "argument --tp: expected an integer from 1 to 1024, got '0'"),
        (["--tp", "-2"], "argument --tp: expected an integer from 1 to 1024, got '-2'"),
        (["--batch-sizes", "1,x"], "argument --batch-sizes: '1,x' must list integers from 1"),
        (["--batch-sizes", "1,70000"], "'1,70000' must list integers from 1 to 65536"),
        (["--dtype", "float64"], "argument --dtype: 'float64' must list dtypes among float32"),
        (["--dtype", ""], "argument --dtype: '' must list dtypes among float32, bfloat16"),
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


def test_the_bandwidth_probe_reads_more_than_a_cache_holds():
    """A small step still gets memory's bandwidth: the probe never reads less than
    PROBE_MIN_BYTES, and it records the thread count it ran with."""
    probe = decode_benchmark.measure_read_bandwidth(4096, device="cpu", repeats=2)
    assert probe.probe_bytes == decode_benchmark.PROBE_MIN_BYTES >= 256 * 2**20
    assert probe.bytes_per_second > 1e8 and probe.threads >= 1
