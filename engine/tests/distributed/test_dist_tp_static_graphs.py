"""Tensor parallelism with static graphs, on ascend_stub under torchrun.

ascend_stub splits its graphs at ``slotwise::tp_all_reduce`` as well as at attention,
so the piece after each all-reduce reads the all-reduce's result: it must stay at the
address that piece's graph was captured with, step after step.  FULL graphs hold the
all-reduce itself, which a replay must run again.  transformers, reading the same
checkpoint, is the oracle for the tokens; the eager run is the bench's oracle for logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from support import torchrun

pytestmark = pytest.mark.slow

STUB = {
    "SLOTWISE_PLATFORM": "ascend_stub",
    "SLOTWISE_ASCEND_STUB_DEVICES": "2",
    "SLOTWISE_DIST_TIMEOUT": "120",
    "SLOTWISE_DISABLE_COMPILE_CACHE": "1",
}
#: The prefill of both prompts (about 35 tokens, padded to 64) and every decode step (2 tokens)
#: run at a capture size: in FULL_AND_PIECEWISE the prefill replays the pieces, the
#: decode steps the FULL graph.
CAPTURE_SIZES = "-O.capture_sizes=[1,2,4,8,16,32,64]"
PROMPTS = ["Hello world, the quick fox", "Grüße aus Köln"]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return make_tokenizer(folder, "llama3")


def transformers_greedy(folder: Path, prompt_ids: list[int]) -> list[int]:
    """transformers' argmax continuation, end-of-sequence ids included, as --ignore-eos."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


@pytest.mark.parametrize("graph_mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
def test_generate_with_tp_2_and_graphs_gives_the_transformers_tokens(folder, graph_mode):
    prompt_args = [arg for prompt in PROMPTS for arg in ("--prompt", prompt)]
    result = torchrun(
        "-m", "slotwise", "generate", "--tp", "2", "--model", str(folder), *prompt_args,
        "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--json",
        "-O3", "-O.backend=eager", f"-O.graph_mode={graph_mode}", CAPTURE_SIZES, **STUB,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    # The platform split at the all-reduce, and the ranks captured graphs.
    assert "'slotwise::tp_all_reduce']" in result.stderr
    assert "captured " in result.stderr and " graphs for 7 sizes" in result.stderr
    results = [json.loads(line) for line in result.stdout.splitlines()]  # rank 0 alone prints
    assert [r["prompt"] for r in results] == PROMPTS
    for r in results:
        assert r["token_ids"] == transformers_greedy(folder, r["prompt_token_ids"])


def test_bench_with_tp_2_and_graphs_matches_eager():
    result = torchrun(
        "-m", "slotwise", "bench", "--tp", "2", "--preset", "tiny", "--batch-sizes", "2",
        "--iterations", "2", "--variants", "level3+graphs,level3+full_graphs",
        "-O.backend=eager", "--json", **STUB,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads(result.stdout)  # rank 0 alone prints
    assert report["tensor_parallel_size"] == 2
    assert report["platform"] == "ascend_stub"
    measured = {m["variant"]: m for m in report["measurements"]}
    assert set(measured) == {"eager", "level3+graphs", "level3+full_graphs"}
    assert all(m["max_abs_logit_diff"] < 1e-4 for m in measured.values())
