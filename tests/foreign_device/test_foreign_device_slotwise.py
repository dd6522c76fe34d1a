"""slotwise and its engine on a device type that is neither cpu nor cuda.

The plugin is what ``slotwise new-plugin foreign --graphs`` writes, its platform asking
the foreign test device (conftest.py).  A test marked ``xfail(strict=True)`` fails today
on an assumption in slotwise that the device is cpu or cuda, named in its reason: once
the assumption is gone it passes, and the strict mark makes the fix remove the mark.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from foreign_runs import WORKER, foreign_overrides, last_json, run_slotwise, run_worker
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from support import torchrun

pytestmark = pytest.mark.slow

PROMPT = "Hello world, the quick fox"
N = 8
LEVELS = {"level0": ["-O0"], "level3-eager": ["-O3", "-O.backend=eager"]}
#: Few capture sizes, so a level-3 start-up captures in seconds; a prompt of up to 8
#: tokens and every decode step still replay captured graphs.
FEW_CAPTURE_SIZES = "-O.capture_sizes=[1,2,4,8]"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = make_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return make_tokenizer(folder, "llama3")


def transformers_greedy(folder: Path, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """transformers' argmax continuation, end-of-sequence ids included, as --ignore-eos."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def test_env_reports_the_foreign_platform_and_its_devices(foreign_site):
    result = run_slotwise(foreign_site, "env", "--json")
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["platform"] == "foreign" and report["error"] is None
    assert report["devices"]["count"] == 2
    assert report["devices"]["list"][0]["name"] == "foreign test device 0"


def test_conformance_passes_on_the_foreign_device(foreign_site):
    result = run_slotwise(foreign_site, "conformance", "foreign", "--json", "--require-all")
    summary = json.loads(result.stdout)
    outcomes = {check["check"]: check["outcome"] for check in summary["checks"]}
    assert result.returncode == 0, json.dumps(summary)[-4000:] + result.stderr[-4000:]
    # Two devices: the collectives check runs too; the graphs are the plugin's recorded ones.
    assert set(outcomes.values()) == {"passed"}, outcomes


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_generate_gives_the_tokens_of_transformers(foreign_site, checkpoint, level):
    result = run_slotwise(
        foreign_site, "generate", "--model", str(checkpoint), "--prompt", PROMPT,
        "--max-new-tokens", str(N), "--ignore-eos", "--json", *LEVELS[level], FEW_CAPTURE_SIZES,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    output = last_json(result.stdout)
    expected = transformers_greedy(checkpoint, output["prompt_token_ids"], N)
    assert output["token_ids"] == expected


def test_seeded_sampling_repeats_with_the_devices_generator(foreign_site, checkpoint):
    args = ["generate", "--model", str(checkpoint), "--prompt", PROMPT, "--max-new-tokens",
            str(N), "--ignore-eos", "--json", "-O0"]  # fmt: skip
    sampled = ["--temperature", "1.5", "--seed", "3"]
    runs = [last_json(run_slotwise(foreign_site, *args, *sampled).stdout) for _ in range(2)]
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    greedy = last_json(run_slotwise(foreign_site, *args).stdout)
    assert runs[0]["token_ids"] != greedy["token_ids"]


BENCH = ["bench", "--preset", "tiny", "--batch-sizes", "1,2", "--iterations", "2", "--json"]


def test_bench_measures_eager_level3_and_graphs_on_the_device(foreign_site):
    result = run_slotwise(foreign_site, *BENCH, "--variants", "eager,level3,level3+graphs")
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["platform"] == "foreign"
    assert {m["variant"] for m in report["measurements"]} == {"eager", "level3", "level3+graphs"}
    assert all(m["max_abs_logit_diff"] < 1e-4 for m in report["measurements"])


def test_bench_default_variants_run_on_the_device(foreign_site):
    result = run_slotwise(foreign_site, *BENCH)
    assert result.returncode == 0, result.stderr[-4000:]


def test_model_runner_with_simulated_graphs_gives_the_eager_tokens(foreign_site):
    result = run_worker(foreign_site, "runner")
    assert result["weights_device"] == "foreign:0" and result["kv_cache_device"] == "foreign"
    assert result["captures"] > 0 and result["replays"] > 0
    assert result["tokens"] == result["eager_tokens"]


def test_build_llama_puts_the_model_on_the_platforms_device(foreign_site):
    assert run_worker(foreign_site, "default-device")["weights_device"] == "foreign:0"


def tensor_parallel(site: Path, checkpoint: Path, *flags: str) -> list[dict]:
    """Each rank's report of foreign_worker.py's tensor-parallel generation, by rank."""
    result = torchrun(
        str(WORKER), "tp", str(checkpoint), *flags,
        **foreign_overrides(site), SLOTWISE_DIST_TIMEOUT="120",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return sorted(reports, key=lambda report: report["rank"])


def test_tensor_parallel_ranks_each_use_their_own_device(foreign_site, checkpoint):
    ranks = tensor_parallel(foreign_site, checkpoint, "0")
    assert [r["weights_device"] for r in ranks] == ["foreign:0", "foreign:1"]
    for rank, report in enumerate(ranks):
        other = 1 - rank
        assert report["memory_by_device"][rank] > 0
        assert report["memory_by_device"][other] == 0, report
    new_tokens = len(ranks[0]["tokens"][0])
    expected = [transformers_greedy(checkpoint, p, new_tokens) for p in ranks[0]["prompts"]]
    assert ranks[0]["tokens"] == ranks[1]["tokens"] == expected


def test_tensor_parallel_with_simulated_graphs_gives_the_level0_tokens(foreign_site, checkpoint):
    eager = tensor_parallel(foreign_site, checkpoint, "0")
    graphs = tensor_parallel(foreign_site, checkpoint, "3", ".backend=eager", FEW_CAPTURE_SIZES[2:])
    assert [r["tokens"] for r in graphs] == [r["tokens"] for r in eager]
