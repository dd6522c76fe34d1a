"""Each platform names its communicator; ascend_stub's runs on its own vendor backend.

``get_communicator_cls`` is checked on the platform objects directly (no device
needed, nor a GPU for cuda); then two ascend_stub processes show which communicator
and torch.distributed backend their groups really use.  (The CPU platform's are
checked by the collectives test, which runs on it.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_worker import WORLD, make_input
from support import free_port, run_together, torchrun_env

from slotwise.distributed import Communicator
from slotwise.distributed.communicator import communicator_class
from slotwise_ascend_stub.communicator import AscendStubCommunicator
from slotwise_ascend_stub.platform import AscendStubPlatform
from slotwise_cpu.communicator import CpuCommunicator
from slotwise_cpu.platform import CpuPlatform
from slotwise_cuda.platform import CudaPlatform

WORKER = Path(__file__).with_name("dist_worker.py")


def test_each_platform_names_its_communicator_and_backend():
    assert CpuPlatform().get_communicator_cls() is CpuCommunicator
    assert CpuPlatform.dist_backend == CpuCommunicator.dist_backend == "gloo"
    assert communicator_class(CudaPlatform()) is Communicator
    assert CudaPlatform.dist_backend == "nccl"
    assert AscendStubPlatform().get_communicator_cls() is AscendStubCommunicator
    assert AscendStubPlatform.dist_backend == AscendStubCommunicator.dist_backend == "hccl_stub"


def test_asking_ascend_stub_for_its_communicator_registers_its_backend_once():
    AscendStubPlatform().get_communicator_cls()
    AscendStubPlatform().get_communicator_cls()
    assert dist.Backend.backend_list.count("hccl_stub") == 1
    assert dist.Backend.HCCL_STUB == "hccl_stub"


def run_platform(tmp_path: Path, **env: str) -> list[dict[str, Any]]:
    port = free_port()
    commands = [
        (
            [sys.executable, str(WORKER), "platform", str(tmp_path)],
            torchrun_env(r, WORLD, port, **env),
        )
        for r in range(WORLD)
    ]
    for rank, finished in enumerate(run_together(commands, timeout=60)):
        assert finished.returncode == 0, f"rank {rank}:\n{finished.stderr[-6000:]}"
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.slow
def test_ascend_stub_collectives_run_over_its_vendor_named_backend(tmp_path):
    env = {"SLOTWISE_PLATFORM": "ascend_stub", "SLOTWISE_ASCEND_STUB_DEVICES": str(WORLD)}
    inputs = [make_input(rank, torch.float32, (4, 6), "platform") for rank in range(WORLD)]
    for results in run_platform(tmp_path, **env):
        assert results["platform"] == "ascend_stub"
        assert results["communicator"] == "AscendStubCommunicator"
        assert results["info_backend"] == "hccl_stub"
        assert results["backends"] == ("hccl_stub", "hccl_stub")  # tensor-parallel, world
        assert results["process_group"] == "ProcessGroupGloo"  # what hccl_stub wraps
        torch.testing.assert_close(results["all_reduce"], inputs[0] + inputs[1])
        torch.testing.assert_close(results["op_all_gather"], torch.cat(inputs))
