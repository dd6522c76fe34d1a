"""``check_ranks_agree``: ranks that hold other facts all stop with one and the same error.

Three real ranks (gloo, torchrun's environment) run a series of checks in one job:
the message names each fact that differs and which ranks hold which value, is the
same on every rank, does not depend on how large each rank's data is, and the group
stays usable after a disagreement.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
from support import free_port, run_together, torchrun_env

import slotwise.distributed as sd
from slotwise.distributed.agreement import MAX_FACTS

WORKER = Path(__file__).with_name("rank_agreement_worker.py")
WORLD = 3
TORCH = "install the same torch"
WEIGHTS = "copy the same weights"


def fact(name: str, data: str, shown: str = "", fix: str = "") -> list[str]:
    return [name, data, shown, fix]


def short_sha(data: str) -> str:
    return "sha256 " + hashlib.sha256(data.encode()).hexdigest()[:12]


def run_checks(checks_by_rank: list[list[list[list[str]]]], out: Path) -> list[list[dict]]:
    """Run the checks (one list per rank) on ``WORLD`` ranks; each rank's results."""
    port = free_port()
    commands = []
    for rank, checks in enumerate(checks_by_rank):
        checks_file = out / f"checks{rank}.json"
        checks_file.write_text(json.dumps(checks))
        commands.append(
            (
                [sys.executable, str(WORKER), str(checks_file), str(out)],
                torchrun_env(rank, WORLD, port, SLOTWISE_DIST_TIMEOUT="60"),
            )
        )
    for rank, finished in enumerate(run_together(commands, timeout=120)):
        assert finished.returncode == 0, f"rank {rank} crashed:\n{finished.stderr[-6000:]}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.mark.slow
def test_ranks_that_differ_all_raise_one_message_naming_what_differs_and_where(tmp_path):
    versions = [
        fact("the versions", f"torch {v}", f"torch {v}", TORCH) for v in ("2.9", "2.8", "2.9")
    ]
    # Rank 2's data is a hundred thousand times larger: the collective's shapes do not care.
    weights = [fact("the weights", data, "", WEIGHTS) for data in ("a", "a", "b" * 100_000)]
    # Alike texts over different data: the digests tell the sides apart.
    prompts = [
        fact("the prompts", data, "1 prompt, 3 tokens")
        for data in ("[1,2,3]", "[1,2,3]", "[1,2,4]")
    ]
    same = [fact("config.json", "{}"), fact("the versions", "torch 2.9", "torch 2.9", TORCH)]
    fewer = [same, same, same[:1]]  # rank 2 runs code that compares one fact less
    checks = [
        [same, [versions[rank], weights[rank]], [prompts[rank]], fewer[rank], same]
        for rank in range(WORLD)
    ]
    results = run_checks(checks, tmp_path)

    for check in range(len(checks[0])):
        assert results[1][check] == results[0][check] == results[2][check], check
    agreed, mixed, alike, unequal, again = results[0]
    assert agreed == again == {"error": None, "message": None}
    assert mixed == {
        "error": "RankDisagreementError",
        "message": "ranks 0, 1 and 2 of the tensor-parallel group disagree on the versions "
        "(ranks 0 and 2: torch 2.9; rank 1: torch 2.8), the weights (ranks 0 and 1: "
        f"{short_sha('a')}; rank 2: {short_sha('b' * 100_000)}): {TORCH}; {WEIGHTS}",
    }
    assert alike["message"] == (
        "ranks 0, 1 and 2 of the tensor-parallel group disagree on the prompts (ranks 0 and 1: "
        f"1 prompt, 3 tokens, {short_sha('[1,2,3]')}; rank 2: 1 prompt, 3 tokens, "
        f"{short_sha('[1,2,4]')})"
    )
    assert unequal["message"] == (
        "ranks 0, 1 and 2 of the tensor-parallel group do not compare the same facts (ranks 0 "
        "and 1: config.json, the versions; rank 2: config.json): they run different slotwise "
        "code; install the same slotwise on every machine"
    )


class TwoRanks:
    """A stand-in for a group of two, for what is refused before any collective."""

    name, ranks, rank, world_size, device = "tp", [0, 1], 0, 2, torch.device("cpu")

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        raise AssertionError("no collective was expected")


def test_more_facts_than_the_records_hold_is_refused_before_any_collective():
    facts = [sd.Fact(f"fact {i}", b"") for i in range(MAX_FACTS + 1)]
    with pytest.raises(ValueError, match=f"{MAX_FACTS + 1} facts to compare; .* takes {MAX_FACTS}"):
        sd.check_ranks_agree(TwoRanks(), facts)
