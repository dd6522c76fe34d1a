"""`slotwise bench startup`: fresh processes timed to the first token, cold then warm."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import pytest
from support import clean_env

from slotwise_engine.bench import startup as startup_benchmark
from slotwise_engine.bench.startup import PHASES, VARIANTS
from slotwise_engine.cli.bench_command import render_startup

# The module: the package slotwise.cli exports its main() under the same name.
cli_main = importlib.import_module("slotwise.cli.main")


@pytest.mark.slow
def test_startup_json_times_eager_cold_and_warm_starts_and_shows_the_caches_at_work():
    command = ["bench", "startup", "--preset", "tiny", "--repeats", "1", "--json"]
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", *command],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["model"], report["layers"], report["repeats"]) == ("tiny", None, 1)
    for variant in VARIANTS:
        run = report[variant]
        assert all(run[phase] >= 0 for phase in PHASES), run
        phases = sum(run[phase] for phase in PHASES)
        # The total is timed by the parent from spawn to first token: the phases fit in it.
        assert 0 < phases <= run["total_s"], run
        assert run["interpreter_s"] == pytest.approx(run["total_s"] - phases, abs=1e-3)
    eager, cold, warm = (report[variant] for variant in VARIANTS)
    assert eager["inductor_compiles"] == eager["dynamo"] == eager["compile_or_load"] == 0
    # Cold: its own empty caches, so Dynamo traces and Inductor compiles every distinct
    # piece (a piece equal to one compiled before is a hit in memory).
    assert cold["cached_files_at_start"] == 0
    assert cold["dynamo"] > 0 and cold["inductor_compiles"] > 0
    assert cold["cache_misses"] == cold["inductor_compiles"]
    # Warm: the caches the cold run filled; every piece is loaded, nothing traced.
    assert warm["cached_files_at_start"] > 0
    assert warm["inductor_compiles"] == 0 and warm["cache_misses"] == 0
    assert warm["cache_hits"] == cold["cache_hits"] + cold["cache_misses"]
    assert warm["dynamo"] == 0, "a warm start ran Dynamo: the saved trace was not used"
    assert report["warm_over_eager"] == pytest.approx(warm["total_s"] / eager["total_s"], 1e-2)
    assert report["warm_over_cold"] == pytest.approx(warm["total_s"] / cold["total_s"], 1e-2)


def test_the_table_shows_every_variant_phase_and_count():
    run = dict.fromkeys(PHASES, 0.25) | {"total_s": 2.0, "interpreter_s": 0.25}
    run |= dict.fromkeys(startup_benchmark.COUNTS, 3)
    result = {"model": "tiny", "layers": 16, "repeats": 2}
    result |= {variant: run for variant in VARIANTS}
    result |= {"warm_over_eager": 1.0, "warm_over_cold": 1.0}
    table = render_startup(result)
    assert table.startswith("slotwise bench startup: tiny with 16 layers, median of 2 rounds")
    for name in (*VARIANTS, *(f"{phase} s" for phase in PHASES), *startup_benchmark.COUNTS):
        assert name in table


class StartupStarted(Exception):
    """run_startup_benchmark was reached: every argument check before it passed."""


@pytest.fixture
def startup_main(monkeypatch) -> Any:
    """main() of `slotwise bench startup` in this process, stopped where it would spawn."""

    def started(model: str, repeats: int, config_json: str, **kwargs: Any) -> None:
        raise StartupStarted(model, repeats, kwargs["layers"])

    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)
    monkeypatch.setattr(startup_benchmark, "run_startup_benchmark", started)
    return lambda *args: cli_main.main(["bench", *args])


def test_layers_and_repeats_reach_the_benchmark(startup_main):
    with pytest.raises(StartupStarted) as started:
        startup_main("startup", "--preset", "tiny", "--layers", "16", "--repeats", "2")
    assert started.value.args == ("tiny", 2, 16)


@pytest.mark.parametrize(
    "args, message",
    [
        (["startup", "--repeats", "0"], "argument --repeats: expected an integer from 1 to 1000"),
        (["startup", "--layers", "0"], "argument --layers: expected an integer from 1 to 1024"),
        (["startup", "--layers", "5000"], "argument --layers: expected an integer from 1 to 1024"),
        (["warmup"], "argument what: invalid choice: 'warmup'"),
    ],
)
def test_startup_refuses_bad_arguments_when_parsing(startup_main, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        startup_main(*args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["startup", "--preset", "huge"], "argument --preset: unknown preset 'huge'"),
        (
            ["decode", "--preset", "tiny", "--layers", "4"],
            "argument --layers: only 'slotwise bench startup --preset NAME' takes it",
        ),
    ],
)
def test_startup_refuses_arguments_the_preset_cannot_take(startup_main, capsys, args, message):
    assert startup_main(*args) == 2
    assert message in capsys.readouterr().err
