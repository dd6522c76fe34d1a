"""`slotwise bench --model DIR`: the decode benchmark on a checkpoint instead of a preset."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from models.hf_checkpoints import make_checkpoint
from support import clean_env

from slotwise.compilation.config import ENV_CONFIG

cli_main = importlib.import_module("slotwise.cli.main")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture
def bench(monkeypatch, capsys):
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli_main.main(["bench", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_bench_measures_a_checkpoint(folder, bench):
    code, out, err = bench(
        "--model", str(folder), "--batch-sizes", "1,2", "--iterations", "2",
        "--variants", "eager,level3", "-O.backend=eager", "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["model"] == str(folder) and report["preset"] is None
    rows = {(m["variant"], m["batch_size"]): m for m in report["measurements"]}
    assert set(rows) == {("eager", 1), ("eager", 2), ("level3", 1), ("level3", 2)}
    assert all(row["max_abs_logit_diff"] < 1e-4 for row in rows.values())
    code, table, _ = bench("--model", str(folder), "--batch-sizes", "1", "--iterations", "1",
                           "--variants", "eager")  # fmt: skip
    assert code == 0 and table.startswith(f"slotwise bench: model {folder} on cpu")


def test_bench_checks_the_checkpoint_before_any_work(folder, bench, tmp_path):
    code, _, err = bench("--model", str(tmp_path / "none"))
    assert code == 2 and "none: no such folder" in err
    code, _, err = bench("--model", str(folder), "--prompt-len", "300")
    assert code == 2
    assert f"argument --prompt-len: model {folder} holds prompts of 1 to 255 tokens" in err


def test_model_and_preset_exclude_each_other(folder, bench, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench("--model", str(folder), "--preset", "tiny")
    assert exit_.value.code == 2
    assert "argument --preset: not allowed with argument --model" in capsys.readouterr().err


@pytest.mark.slow
def test_the_comparison_with_transformers_runs(tmp_path):
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "decode_vs_transformers.py"
    result = subprocess.run(
        [sys.executable, str(script), "--hidden-size", "128", "--intermediate-size", "256",
         "--layers", "2", "--vocab-size", "512", "--iterations", "2", "--warmups", "1",
         "--skip", "transformers compile+static", "--out-dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600,
        env=clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    dtypes = ("float32", "bfloat16")
    assert report["failed"] == {
        f"transformers compile+static, {dtype}": "skipped (--skip)" for dtype in dtypes
    }
    names = ("transformers eager", "slotwise eager", "slotwise level3")
    for batch in ("1", "8"):
        rows = report["results"][batch]
        assert set(rows) == {f"{name}, {dtype}" for name in names for dtype in dtypes}
        for key, row in rows.items():
            assert row["max_abs_logit_diff"] < (1e-4 if key.endswith("float32") else 0.05)
    assert (tmp_path / "decode_vs_transformers.md").is_file()
