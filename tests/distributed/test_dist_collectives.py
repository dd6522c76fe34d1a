"""Every collective, over two processes started by torchrun, against a one-process oracle.

One torchrun job runs all the cases (float32, bfloat16 and int64; three shapes;
dims 0 and -1) through the platform's communicator and through the collective
custom ops, and saves what each rank got; each case is then checked here against
the same computation done on the full inputs in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_worker import WORLD, Case, collective_cases
from support import free_port, process_env, run_together

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("dist_worker.py")
#: Whose result is a fresh tensor (the contract says contiguous and not the input).
FRESH = ("all_reduce", "all_gather", "reduce_scatter", "gather")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("collectives")
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={WORLD}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "--max-restarts=0",
    ]
    [job] = run_together([([*torchrun, str(WORKER), "collectives", str(out)], process_env())], 120)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-6000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]


def oracle(case: Case, rank: int) -> torch.Tensor | None:
    """What rank ``rank`` must get, computed from every rank's input in one process."""
    inputs = [case.input(r) for r in range(WORLD)]
    op = case.op.removeprefix("op_").removesuffix("_out")
    if op == "all_reduce":
        return sum(inputs[1:], inputs[0])
    if op == "all_gather":
        return torch.cat(inputs, case.dim)
    if op == "reduce_scatter":
        return sum(inputs[1:], inputs[0]).chunk(WORLD, case.dim)[rank]
    if op == "gather":
        return torch.cat(inputs, case.dim) if rank == 1 else None
    if op == "broadcast":
        return inputs[1]
    if op == "send_recv":
        return inputs[1 - rank]
    raise ValueError(case.op)


@pytest.mark.parametrize("case", collective_cases(), ids=lambda case: case.key)
def test_collective_matches_the_single_process_oracle(ranks, case):
    for rank, results in enumerate(ranks):
        got, expected = results[case.key], oracle(case, rank)
        if expected is None:
            assert got is None, f"rank {rank}"
            continue
        assert got.dtype == expected.dtype, f"rank {rank}"
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=f"rank {rank}")
        if case.op.removeprefix("op_") in FRESH:
            assert got.is_contiguous(), f"rank {rank}"


def test_the_ranks_ran_the_cpu_platforms_communicator(ranks):
    assert [results["rank"] for results in ranks] == [0, 1]
    assert {results["communicator"] for results in ranks} == {"CpuCommunicator"}
    assert {results["backend"] for results in ranks} == {"gloo"}
