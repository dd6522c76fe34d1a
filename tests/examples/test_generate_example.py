"""examples/generate.py: greedy tokens from the compiled model equal the eager ones, and
bad arguments are refused before the model is built."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import clean_env

from slotwise.compilation.config import ENV_CONFIG

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generate.py"


def test_generate_example_matches_eager():
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--prompt",
            "3,1,4,1,5",
            "--max-new-tokens",
            "4",
            "-O.backend=eager",
            "--check",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["matches_eager"] is True
    assert len(report["tokens"][0]) == 4


class Built(Exception):
    """build_llama was reached, with the config it got: every check before it passed."""


@pytest.fixture
def example(monkeypatch) -> Callable[..., int]:
    """The example's main() in this process, stopped where it would build the model."""
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def built(preset: str, **kwargs: Any) -> None:
        raise Built(kwargs["compilation_config"])

    monkeypatch.setattr(module, "build_llama", built)
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)
    monkeypatch.delenv(ENV_CONFIG, raising=False)

    def run(*args: str) -> int:
        monkeypatch.setattr(sys, "argv", ["generate.py", *args])
        return module.main()

    return run


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--max-new-tokens", "0"],
            "argument --max-new-tokens: expected an integer from 1 to 2147483647",
        ),
        (["--prompt", "1,256"], "prompt 0 has token id 256, outside the vocabulary of 256"),
        (["--prompt", "1,2", "--prompt", "3,-1"], "prompt 1 has token id -1"),
        (["--prompt", "1", "--max-new-tokens", "600"], "over max_model_len 512"),
        (["-O.level=9"], "compilation config key 'level'"),
    ],
)
def test_generate_example_refuses_bad_arguments_before_building(example, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        example(*args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_generate_example_refuses_a_bad_environment_config(example, capsys, monkeypatch):
    monkeypatch.setenv(ENV_CONFIG, '{"level": 9}')
    with pytest.raises(SystemExit) as exited:
        example()
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("generate.py: error: SLOTWISE_COMPILATION_CONFIG: ")
    assert "'level'" in error


def test_generate_example_lays_o_flags_over_the_environment_config(example, monkeypatch):
    monkeypatch.setenv(ENV_CONFIG, '{"backend": "eager", "graph_warmups": 3}')
    with pytest.raises(Built) as built:
        example("-O.graph_warmups=2")
    (config,) = built.value.args
    assert (config.backend, config.graph_warmups) == ("eager", 2)
