"""``TORCH_COMPILE_DISABLE=1`` runs every level eagerly, as torch.compile and vLLM do.

Through `slotwise generate` in a fresh process, where torch reads the variable itself:
levels 2 and 3 would otherwise find no frame compiled under ``fullgraph=True`` and fail.
transformers, reading the same checkpoint, is the oracle for the tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from support import clean_env

PROMPT = "Hello world, the quick fox"
N = 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return make_tokenizer(folder, "llama3")


def transformers_greedy(folder: Path, prompt_ids: list[int]) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    output = model.generate(
        torch.tensor([prompt_ids]), do_sample=False, min_new_tokens=N, max_new_tokens=N
    )
    return output[0, len(prompt_ids) :].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("level", [2, 3])
def test_generate_runs_eagerly_with_one_warning(folder, level):
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "generate", "--model", str(folder),
         "--prompt", PROMPT, "--max-new-tokens", str(N), "--ignore-eos", "--json",
         f"-O{level}", "-O.backend=eager"],
        capture_output=True, text=True, timeout=300,
        env=clean_env(TORCH_COMPILE_DISABLE="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    output = json.loads(line)
    assert output["token_ids"] == transformers_greedy(folder, output["prompt_token_ids"])
    warnings = [line for line in result.stderr.splitlines() if "TORCH_COMPILE_DISABLE" in line]
    assert warnings == [
        f"WARNING slotwise: TORCH_COMPILE_DISABLE=1: LlamaModel runs eagerly instead of at "
        f"compilation level {level} ({['DYNAMO_ONCE', 'PIECEWISE'][level - 2]}), and captures "
        "no static graphs (graph_mode NONE); unset TORCH_COMPILE_DISABLE to compile it"
    ]
    assert "Traceback" not in result.stderr and "captured" not in result.stderr
