"""Two Llama checkpoints behind one Inductor compile cache, the first request of one
token: each generates its own eager tokens, in this process and in a later one whose
first request has four tokens and loads what this one compiled."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from slotwise.compilation import CompilationConfig
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

LLAMA_PROMPTS = [[1, 5, 9, 3], [7, 7, 2], [42, 11, 100, 3, 4, 5, 6, 7, 8]]

GENERATE_IN_A_NEW_PROCESS = """
import json, sys
from slotwise.compilation import CompilationConfig, counters
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids
config = CompilationConfig(level=3, backend="inductor", cache_dir=sys.argv[1])
runner = ModelRunner(build_llama("tiny", seed=int(sys.argv[2]), compilation_config=config),
                     num_blocks=32)
tokens = generate_token_ids(runner, json.loads(sys.argv[3]), 6)
print(json.dumps({"tokens": tokens, "hits": counters.num_cache_hits}))
"""


def llama_tokens(seed: int, config: CompilationConfig, first_prompt=None) -> list[list[int]]:
    runner = ModelRunner(build_llama("tiny", seed=seed, compilation_config=config), num_blocks=32)
    if first_prompt is not None:
        generate_token_ids(runner, [first_prompt], 1)
    return generate_token_ids(runner, LLAMA_PROMPTS, 6)


@pytest.mark.slow
def test_two_llama_checkpoints_share_a_cache_after_a_one_token_first_request(tmp_path):
    eager = {seed: llama_tokens(seed, CompilationConfig(level=0)) for seed in (0, 1)}
    assert eager[0] != eager[1]
    config = CompilationConfig(level=3, backend="inductor", cache_dir=str(tmp_path))
    for seed in (0, 1):
        assert llama_tokens(seed, config, first_prompt=[17]) == eager[seed], f"seed {seed}"
    # A later process whose first request has four tokens loads the same artifacts.
    for seed in (1, 0):
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(GENERATE_IN_A_NEW_PROCESS),
                str(tmp_path),
                str(seed),
                json.dumps([[3, 1, 4, 1], *LLAMA_PROMPTS]),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        loaded = json.loads(result.stdout.splitlines()[-1])
        assert loaded["hits"] > 0
        assert loaded["tokens"][1:] == eager[seed], f"seed {seed} in a new process"
