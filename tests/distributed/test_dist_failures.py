"""A broken job fails fast with an error that names the problem, instead of hanging.

Two processes (or one where a rank never starts) with the environment torchrun
would give them; each launch is bounded by a subprocess timeout well above what the
ranks should need, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import LAUNCHER_VARIABLES, free_port, run_together, torchrun_env

import slotwise.distributed as sd

WORKER = Path(__file__).with_name("dist_worker.py")
TIMEOUT_S = 3
#: Time the failing rank may take beyond the configured timeout: process start-up
#: and a loaded machine, still far below the 600 s default a broken setting would use.
SLACK_S = 10
#: torch's store client retries an unanswered connect with a randomised back-off of
#: a few seconds, so an unreachable address takes a few tries of the timeout.
UNREACHABLE_BOUND_S = 30


def launch(scenario: str, out: Path, *, processes: int = 2, **env: str) -> list[dict[str, Any]]:
    """Run ``scenario`` on ranks ``0..processes-1``; the results of those that saved any."""
    port = free_port()
    world_size = env.pop("WORLD_SIZE", str(processes))
    commands = [
        (
            [sys.executable, str(WORKER), scenario, str(out)],
            torchrun_env(rank, int(world_size), port, SLOTWISE_DIST_TIMEOUT=str(TIMEOUT_S), **env),
        )
        for rank in range(processes)
    ]
    for rank, finished in enumerate(run_together(commands, timeout=60)):
        assert finished.returncode == 0, f"rank {rank} crashed:\n{finished.stderr[-6000:]}"
    return [torch.load(path, weights_only=True) for path in sorted(out.glob("rank*.pt"))]


@pytest.mark.slow
def test_a_rank_that_exits_early_makes_the_other_fail_at_once(tmp_path):
    [rank0] = launch("peer_exits", tmp_path)
    assert rank0["error"] == "CollectiveError", rank0
    assert rank0["seconds"] < TIMEOUT_S + SLACK_S
    assert "all_reduce on group 'tp' (rank 0 of 2, gloo) failed" in rank0["message"]
    assert "another rank probably exited" in rank0["message"]


@pytest.mark.slow
def test_a_rank_that_never_joins_the_collective_times_out_in_the_configured_time(tmp_path):
    [rank0] = launch("peer_stuck", tmp_path)
    assert rank0["error"] == "DistributedTimeoutError", rank0
    assert TIMEOUT_S - 0.5 < rank0["seconds"] < TIMEOUT_S + SLACK_S
    assert f"did not complete within the {TIMEOUT_S} s timeout" in rank0["message"]
    assert "SLOTWISE_DIST_TIMEOUT" in rank0["message"]


@pytest.mark.slow
def test_a_rank_that_never_starts_fails_the_rendezvous_in_the_configured_time(tmp_path):
    [rank0] = launch("init_only", tmp_path, processes=1, WORLD_SIZE="2")
    assert rank0["error"] == "DistributedInitError", rank0
    assert rank0["seconds"] < TIMEOUT_S + SLACK_S
    assert "only 1 of 2 processes joined" in rank0["message"]


@pytest.mark.slow
def test_a_world_size_larger_than_the_processes_started_is_a_clear_error(tmp_path):
    ranks = launch("init_only", tmp_path, WORLD_SIZE="3")
    assert [rank["error"] for rank in ranks] == ["DistributedInitError"] * 2, ranks
    assert "only 2 of 3 processes joined" in ranks[0]["message"]
    assert "not all 3 processes joined" in ranks[1]["message"]
    for rank in ranks:
        assert "check that WORLD_SIZE matches the number of processes" in rank["message"]
        assert rank["seconds"] < TIMEOUT_S + SLACK_S


def test_an_unreachable_rendezvous_is_a_clear_error(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    closed = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(sd.DistributedInitError) as raised:
        sd.init_distributed(rank=1, world_size=2, init_method=closed, timeout=1)
    assert time.monotonic() - started < UNREACHABLE_BOUND_S
    message = str(raised.value)
    assert f"rank 1 of 2 could not set up the process groups through {closed}" in message
    assert "nothing answered there" in message
    assert not dist.is_initialized() and not sd.is_initialized()
