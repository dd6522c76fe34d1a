"""Each platform names its communicator; ascend_stub's runs on its own vendor backend.

Every bundled plugin by design: the distributed layer is checked against the platforms
users install, reached only as discovery reaches them (their entry points,
``SLOTWISE_PLATFORM``), never through their modules; each plugin's own tests check its
communicator's code.  ``get_communicator_cls`` is asked of the platform objects (no
device needed, nor a GPU for cuda); then two ascend_stub processes show which
communicator and torch.distributed backend their groups really use.  (The CPU
platform's are checked by the collectives test, which runs on it.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_worker import WORLD, make_input
from support import free_port, run_together, torchrun_env

from slotwise.distributed import Communicator
from slotwise.distributed.communicator import communicator_class
from slotwise.platforms import Platform
from slotwise.platforms.resolution import get_resolver, instantiate

WORKER = Path(__file__).with_name("dist_worker.py")


def bundled(name: str) -> Platform:
    """The bundled plugin's platform ``name``, through its entry point."""
    return instantiate(get_resolver().entries[name])


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def test_each_platform_names_its_communicator_and_backend():
    cpu, cuda, ascend_stub = bundled("cpu"), bundled("cuda"), bundled("ascend_stub")
    cpu_communicator = cpu.get_communicator_cls()
    assert class_path(cpu_communicator) == "slotwise_cpu.communicator:CpuCommunicator"
    assert cpu.dist_backend == cpu_communicator.dist_backend == "gloo"
    assert communicator_class(cuda) is Communicator
    assert cuda.dist_backend == "nccl"
    stub_communicator = ascend_stub.get_communicator_cls()
    assert class_path(stub_communicator) == (
        "slotwise_ascend_stub.communicator:AscendStubCommunicator"
    )
    assert ascend_stub.dist_backend == stub_communicator.dist_backend == "hccl_stub"


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
