"""``AscendStubCommunicator`` and the "hccl_stub" torch.distributed backend it runs on.

A real NPU plugin ships a collective library (HCCL for Ascend) that registers itself
with torch.distributed under its own name.  The stub shows the same wiring on the
CPU: it registers the backend name "hccl_stub", whose process groups are gloo groups
under the hood, and its communicator insists on that backend.  Registration happens
when the platform is asked for its communicator class, which ``init_distributed``
does before it creates any process group.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

from slotwise.plugin_api import Communicator

#: The vendor's torch.distributed backend name, as in ``init_process_group("hccl_stub")``.
BACKEND_NAME = "hccl_stub"


def _create_backend(
    store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta
) -> dist.ProcessGroupGloo:
    """torch.distributed calls this for every "hccl_stub" group; a real plugin would
    return its own ``c10d`` backend here."""
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def register_backend() -> None:
    """Make "hccl_stub" a torch.distributed backend for CPU tensors; idempotent."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    # devices must be a list: torch iterates over it (a bare "cpu" would be 'c', 'p', 'u').
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["cpu"])


class AscendStubCommunicator(Communicator):
    dist_backend = BACKEND_NAME
