"""The stub's communicator runs on a torch.distributed backend of its own name, registered
the first time the platform is asked for it (its collectives: the core's
tests/distributed/test_dist_platforms.py, over two processes)."""

from __future__ import annotations

import torch.distributed as dist

from slotwise_ascend_stub.communicator import AscendStubCommunicator
from slotwise_ascend_stub.platform import AscendStubPlatform


def test_asking_ascend_stub_for_its_communicator_registers_its_backend_once():
    assert AscendStubPlatform().get_communicator_cls() is AscendStubCommunicator
    AscendStubPlatform().get_communicator_cls()
    assert dist.Backend.backend_list.count("hccl_stub") == 1
    assert dist.Backend.HCCL_STUB == "hccl_stub"
    assert AscendStubPlatform.dist_backend == AscendStubCommunicator.dist_backend == "hccl_stub"
