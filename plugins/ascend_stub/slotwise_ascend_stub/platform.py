"""``AscendStubPlatform``: an NPU simulated on the CPU.

Attributes say what the hardware is; methods answer questions about it.  A real
vendor plugin would call its SDK (imported inside the methods) where this stub
uses the CPU.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from slotwise.plugin_api import Platform
from slotwise_ascend_stub.plugin import DEVICES_ENV_VAR

if TYPE_CHECKING:
    from slotwise.plugin_api import CompilationConfig
    from slotwise_ascend_stub.graphs import StubNpuGraphAPI

#: Memory each simulated NPU pretends to have.
STUB_DEVICE_MEMORY = 16 * 1024**3
#: The tensor-parallel all-reduce, which the stub keeps out of its piecewise graphs.
COLLECTIVE_SPLITTING_OP = "slotwise::tp_all_reduce"


class AscendStubPlatform(Platform):
    name = "ascend_stub"
    device_type = "cpu"  # tensors live on the CPU; a real NPU would say "npu"
    dist_backend = "hccl_stub"  # vendor-named collective backend, running on gloo
    device_control_env_var = DEVICES_ENV_VAR
    default_compile_backend = "eager"  # no Inductor backend for this "hardware"
    custom_op_key = "oot"  # CustomOp.forward_oot is the out-of-tree implementation

    def __init__(self) -> None:
        super().__init__()
        self._current_device = 0

    def device_count(self, **kwargs: Any) -> int:
        return int(os.environ.get(DEVICES_ENV_VAR, "0") or 0)

    def get_device_name(self, device_id: int = 0, **kwargs: Any) -> str:
        return f"Ascend stub NPU {device_id}"

    def get_device_capability(self, device_id: int = 0, **kwargs: Any) -> None:
        return None

    def total_memory(self, device_id: int = 0, **kwargs: Any) -> int:
        return STUB_DEVICE_MEMORY

    def set_device(self, device_id: int, **kwargs: Any) -> None:
        if not 0 <= device_id < self.device_count():
            raise ValueError(
                f"ascend_stub device {device_id} does not exist; "
                f"{DEVICES_ENV_VAR}={self.device_count()}"
            )
        self._current_device = device_id

    def synchronize(self, **kwargs: Any) -> None:
        return None  # the simulated device runs synchronously

    def get_communicator_cls(self, **kwargs: Any) -> type:
        """Register the "hccl_stub" backend (on first use) and return its communicator."""
        from slotwise_ascend_stub.communicator import AscendStubCommunicator, register_backend

        register_backend()
        return AscendStubCommunicator

    def get_graph_api(self, **kwargs: Any) -> StubNpuGraphAPI:
        """NPU graphs, simulated on the CPU: slotwise captures and replays through them."""
        from slotwise_ascend_stub.graphs import stub_graph_api

        return stub_graph_api

    def check_and_update_config(self, config: CompilationConfig, **kwargs: Any) -> None:
        """The all-reduce runs between the piecewise graphs on this "hardware" (a FULL
        graph holds it, as it holds attention).

        Adding a splitting op is how a platform keeps an op out of its static graphs;
        slotwise logs the change.  (Real NPUs have their own such ops.)
        """
        ops = config.resolved_splitting_ops
        if COLLECTIVE_SPLITTING_OP not in ops:
            config.splitting_ops = [*ops, COLLECTIVE_SPLITTING_OP]
