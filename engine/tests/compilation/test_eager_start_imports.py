"""An eager model never loads the compiler stack: Dynamo, Inductor and sympy cost an eager
start over a second of imports, so they load only when a model is compiled."""

from __future__ import annotations

import json
import subprocess
import sys

COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "sympy")

_GENERATE = """
import json, sys
import torch
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

runner = ModelRunner(build_llama("tiny", compilation_config={level}), num_blocks=8)
tokens = generate_token_ids(runner, [[1, 5, 9, 3]], 2)
print(json.dumps({{"tokens": tokens, "loaded": [m for m in {modules!r} if m in sys.modules]}}))
"""


def _run(level: int) -> dict:
    code = _GENERATE.format(level=level, modules=COMPILER_MODULES)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_eager_model_builds_and_generates_without_the_compiler_stack():
    report = _run(level=0)
    assert len(report["tokens"][0]) == 2
    assert report["loaded"] == []
