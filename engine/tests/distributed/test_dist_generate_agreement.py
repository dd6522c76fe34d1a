"""Tensor-parallel ranks given other checkpoints or other requests stop with one error.

``slotwise generate`` compares, right after the group is up, config.json, the
safetensors headers, sampled weight bytes, the versions, the prompts' ids, the
sampling parameters and the stopping rules; ``load_model`` and ``generate`` compare
their part again for library callers.  Two real ranks (torchrun's environment, gloo)
get different inputs: each exits with status 2 and the same one-line error, never
with an abort; ranks that agree, on two byte-identical copies of a checkpoint, still
generate.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from models.hf_checkpoints import make_checkpoint
from models.hf_tokenizers import make_tokenizer
from safetensors.torch import load_file, save_file
from support import Finished, free_port, run_together, torchrun_env

from slotwise_engine.models.checkpoint_agreement import (
    CONFIG,
    LAYOUT,
    SAME_CHECKPOINT,
    VERSIONS,
    WEIGHTS,
    checkpoint_facts,
)
from slotwise_engine.runner.request_agreement import PROMPTS, SAMPLING, STOPPING, request_facts
from slotwise_engine.runner.sampling import SamplingParams

WORKER = Path(__file__).with_name("generate_agreement_worker.py")
ERROR = "slotwise generate: error: "
TENSOR = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """ "a"; "copy", a byte-identical copy of it; "seed1", the same shapes drawn from
    another seed; "one tensor", "a" with one tensor scaled; "qwen3", other shapes."""
    root = tmp_path_factory.mktemp("agreement")
    folders = {
        "a": make_tokenizer(make_checkpoint("llama", root / "a"), "llama3"),
        "seed1": make_tokenizer(make_checkpoint("llama", root / "seed1", seed=1), "llama3"),
        "qwen3": make_tokenizer(make_checkpoint("qwen3", root / "qwen3"), "llama3"),
    }
    folders["copy"] = Path(shutil.copytree(folders["a"], root / "copy"))
    folders["one tensor"] = Path(shutil.copytree(folders["a"], root / "one tensor"))
    weights = folders["one tensor"] / "model.safetensors"
    tensors = load_file(weights)
    tensors[TENSOR] = tensors[TENSOR] * 1.01
    save_file(tensors, weights, metadata={"format": "pt"})
    return folders


def facts_by_name(folder: Path) -> dict:
    return {fact.name: fact for fact in checkpoint_facts(folder)}


@pytest.mark.parametrize(
    "other, differ",
    [
        ("copy", []),
        ("seed1", [WEIGHTS]),
        ("one tensor", [WEIGHTS]),
        ("qwen3", [CONFIG, LAYOUT, WEIGHTS]),
    ],
)
def test_checkpoint_facts_differ_exactly_where_the_checkpoints_do(checkpoints, other, differ):
    mine, theirs = facts_by_name(checkpoints["a"]), facts_by_name(checkpoints[other])
    assert list(mine) == [CONFIG, LAYOUT, WEIGHTS, VERSIONS]
    assert [name for name in mine if mine[name] != theirs[name]] == differ


def test_config_json_is_compared_byte_for_byte_and_the_tensors_are_counted(checkpoints):
    facts = facts_by_name(checkpoints["a"])
    assert facts[CONFIG].data == (checkpoints["a"] / "config.json").read_bytes()
    assert (
        facts[LAYOUT].shown == f"{len(load_file(checkpoints['a'] / 'model.safetensors'))} tensors"
    )
    assert facts[VERSIONS].shown.startswith("slotwise ")


def test_a_checkpoint_the_rank_cannot_read_is_a_fact_not_an_error(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    facts = checkpoint_facts(tmp_path / "x")
    assert [(f.shown, f.fix) for f in facts[:3]] == [("unreadable", SAME_CHECKPOINT)] * 3
    # Ranks that fail alike agree, whatever their paths: the loader reports it next.
    assert checkpoint_facts(tmp_path / "y") == facts


REQUEST = {
    "prompts": [[1, 2, 3], [4, 5]],
    "sampling": SamplingParams(),
    "max_new_tokens": 8,
    "eos_token_ids": [2, 7],
    "ignore_eos": False,
}


@pytest.mark.parametrize(
    "change, differ",
    [
        ({"prompts": [[1, 2, 3], [4, 6]]}, [PROMPTS]),
        ({"prompts": [[1, 2, 3]]}, [PROMPTS, SAMPLING]),  # one SamplingParams per prompt
        ({"sampling": SamplingParams(temperature=1.0, seed=3)}, [SAMPLING]),
        ({"sampling": [SamplingParams(), SamplingParams(top_p=0.5)]}, [SAMPLING]),
        ({"max_new_tokens": 9}, [STOPPING]),
        ({"eos_token_ids": [2]}, [STOPPING]),
        ({"ignore_eos": True}, [STOPPING]),
        # The same request, written otherwise:
        ({"sampling": [SamplingParams(), SamplingParams()]}, []),
        ({"eos_token_ids": (7, 2, 2)}, []),
        ({"prompts": ([1, 2, 3], (4, 5))}, []),
    ],
)
def test_request_facts_differ_exactly_where_the_requests_do(change, differ):
    mine = request_facts(**REQUEST)
    theirs = request_facts(**{**REQUEST, **change})
    assert [a.name for a, b in zip(mine, theirs, strict=True) if a != b] == differ


def generate_on_two_ranks(*per_rank: list[str]) -> list[Finished]:
    """``slotwise generate --tp 2`` with each rank's own arguments."""
    port = free_port()
    commands = [
        (
            [sys.executable, "-m", "slotwise", "generate", "--tp", "2", "-O0", *args],
            torchrun_env(rank, 2, port, SLOTWISE_DIST_TIMEOUT="60"),
        )
        for rank, args in enumerate(per_rank)
    ]
    return run_together(commands, timeout=180)


def one_error(ranks: list[Finished]) -> str:
    """The error every rank printed, checked to be one line, the same on every rank, with
    exit status 2 and nothing on stdout: no abort, no traceback, no hang."""
    for rank, finished in enumerate(ranks):
        report = f"rank {rank} (exit {finished.returncode}):\n{finished.stderr[-4000:]}"
        assert finished.returncode == 2, report
        assert "terminate called" not in finished.stderr and "Traceback" not in finished.stderr
        assert finished.stdout == "", report
    errors = [[line for line in f.stderr.splitlines() if line.startswith(ERROR)] for f in ranks]
    assert len(errors[0]) == 1 and errors[1] == errors[0], errors
    return errors[0][0].removeprefix(ERROR)


ONE_PROMPT = ["--prompt", "Hello world", "--max-new-tokens", "4"]
SAMPLED = ["--temperature", "1", "--top-k", "5"]
WHO = "ranks 0 and 1 of the tensor-parallel group disagree on "


@pytest.mark.slow
@pytest.mark.parametrize(
    "rank0, rank1, expected",
    [
        (["a"], ["seed1"], [f"{WHO}{WEIGHTS} (rank 0: sha256 ", f"): {SAME_CHECKPOINT}"]),
        (
            ["a"],
            ["qwen3"],
            [
                # What `sha256sum config.json` prints, on each machine.
                f"{WHO}{CONFIG} (rank 0: sha256 {{a config}}; rank 1: sha256 {{qwen3 config}}), "
                f"{LAYOUT} (rank 0: 21 tensors; rank 1: 24 tensors), {WEIGHTS} (rank 0: sha256 ",
                f"): {SAME_CHECKPOINT}",
            ],
        ),
        (
            ["a", "--prompt", "Hello"],
            ["a", "--prompt", "Hello world, the quick fox"],
            [f"{WHO}{PROMPTS} (rank 0: 2 prompts, ", "; rank 1: 2 prompts, ", "tokenizer files"],
        ),
        (
            ["a", *SAMPLED, "--seed", "3"],
            ["a", *SAMPLED, "--seed", "4"],
            [
                f"{WHO}{SAMPLING} (rank 0: temperature 1.0, top_k 5, top_p 1.0, seed 3; rank 1: "
                "temperature 1.0, top_k 5, top_p 1.0, seed 4): give every rank the same sampling "
                "parameters"
            ],
        ),
        (
            ["a", "--ignore-eos"],
            ["a"],
            [
                f"{WHO}{STOPPING} (rank 0: max_new_tokens 4, 2 end-of-sequence ids, ignore_eos; "
                "rank 1: max_new_tokens 4, 2 end-of-sequence ids): "
            ],
        ),
    ],
    ids=["same-shapes-other-weights", "other-shapes", "prompts", "sampling", "stopping"],
)
def test_ranks_that_disagree_exit_with_one_error_on_every_rank(checkpoints, rank0, rank1, expected):
    def args(spec: list[str]) -> list[str]:
        return ["--model", str(checkpoints[spec[0]]), *ONE_PROMPT, *spec[1:]]

    message = one_error(generate_on_two_ranks(args(rank0), args(rank1)))
    configs = {
        f"{name} config": hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:12]
        for name, folder in checkpoints.items()
    }
    position = 0
    for part in (part.format(**configs) for part in expected):  # in this order
        assert part in message[position:], message
        position = message.index(part, position) + len(part)
    # Nothing else is named as differing.
    assert message.count("(rank 0:") == sum(part.count("(rank 0:") for part in expected), message


@pytest.mark.slow
def test_ranks_on_two_identical_copies_of_a_checkpoint_generate(checkpoints):
    common = [*ONE_PROMPT, "--ignore-eos", "--json"]
    rank0, rank1 = generate_on_two_ranks(
        ["--model", str(checkpoints["a"]), *common], ["--model", str(checkpoints["copy"]), *common]
    )
    assert rank0.returncode == rank1.returncode == 0, rank0.stderr[-4000:] + rank1.stderr[-4000:]
    assert len(json.loads(rank0.stdout)["token_ids"]) == 4
    assert rank1.stdout == ""  # rank 0 alone prints


@pytest.mark.slow
def test_load_model_and_generate_check_the_ranks_for_library_callers(checkpoints, tmp_path):
    port = free_port()
    commands = [
        (
            [sys.executable, str(WORKER), str(tmp_path), str(checkpoints[mine]),
             str(checkpoints["a"]), json.dumps(prompts), json.dumps([[5, 6, 7]])],
            torchrun_env(rank, 2, port, SLOTWISE_DIST_TIMEOUT="60"),
        )
        for rank, (mine, prompts) in enumerate([("a", [[1, 2, 3]]), ("qwen3", [[1, 2, 3, 4]])])
    ]  # fmt: skip
    for rank, finished in enumerate(run_together(commands, timeout=180)):
        assert finished.returncode == 0, f"rank {rank} crashed:\n{finished.stderr[-6000:]}"
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["load"] == rank1["load"]
    assert rank0["load"]["error"] == "RankDisagreementError"
    assert f"{WHO}{CONFIG} " in rank0["load"]["message"]
    assert rank0["generate"] == rank1["generate"]
    assert rank0["generate"]["error"] == "RankDisagreementError"
    assert rank0["generate"]["message"].startswith(
        f"{WHO}{PROMPTS} (rank 0: 1 prompt, 3 tokens; rank 1: 1 prompt, 4 tokens)"
    )
    # The group is still in step after both errors: the agreeing call generates.
    assert rank0["again"] == rank1["again"]
    assert rank0["again"]["error"] is None and len(rank0["again"]["result"][0]) == 4
