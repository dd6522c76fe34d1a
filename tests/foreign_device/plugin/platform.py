"""``ForeignPlatform``: the "foreign" test device (tests/foreign_device) as a slotwise platform.

Replaces the platform.py that ``slotwise new-plugin foreign --graphs`` writes: where the
scaffold lets the host CPU stand in, this one asks ``torch.foreign`` (the test device's
runtime module), so tensors live on device type "foreign", neither cpu nor cuda.
The rest of the generated package (probe, attention, custom ops, graphs) is used as
generated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotwise.plugin_api import Platform

if TYPE_CHECKING:
    from slotwise.plugin_api import CompilationConfig, GraphAPI

#: Memory each foreign device reports; its allocations are host memory.
DEVICE_MEMORY = 16 * 1024**3
#: The tensor-parallel all-reduce: staged through the host, so no graph can hold it.
COLLECTIVE_SPLITTING_OP = "slotwise::tp_all_reduce"


class ForeignPlatform(Platform):
    name = "foreign"
    device_type = "foreign"
    dist_backend = "gloo"  # collectives staged through the host (communicator.py)
    device_control_env_var = "FOREIGN_DEVICES"  # the device count the runtime reads
    default_compile_backend = "eager"  # Inductor has no code generator for "foreign"
    custom_op_key = "oot"

    def __init__(self) -> None:
        super().__init__()
        import foreign_torch  # noqa: F401  (loads the device into torch, as torch_npu does)

    def device_count(self, **kwargs: Any) -> int:
        import torch

        return torch.foreign.device_count()

    def get_device_name(self, device_id: int = 0, **kwargs: Any) -> str:
        import torch

        return torch.foreign.get_device_name(device_id)

    def get_device_capability(self, device_id: int = 0, **kwargs: Any) -> None:
        return None

    def total_memory(self, device_id: int = 0, **kwargs: Any) -> int:
        return DEVICE_MEMORY

    def current_memory_usage(self, device_id: int = 0, **kwargs: Any) -> int:
        import torch

        return torch.foreign.memory_allocated(device_id)

    def set_device(self, device_id: int, **kwargs: Any) -> None:
        import torch

        if not 0 <= device_id < self.device_count():
            raise ValueError(
                f"foreign device {device_id} does not exist; FOREIGN_DEVICES={self.device_count()}"
            )
        torch.foreign.set_device(device_id)

    def synchronize(self, **kwargs: Any) -> None:
        import torch

        torch.foreign.synchronize()

    def check_and_update_config(self, config: CompilationConfig, **kwargs: Any) -> None:
        """Collectives run between graphs: their copies to the host cannot be captured."""
        ops = config.resolved_splitting_ops
        if COLLECTIVE_SPLITTING_OP not in ops:
            config.splitting_ops = [*ops, COLLECTIVE_SPLITTING_OP]

    def get_communicator_cls(self, **kwargs: Any) -> type:
        from slotwise_foreign.communicator import HostStagedCommunicator

        return HostStagedCommunicator

    def get_graph_api(self, **kwargs: Any) -> GraphAPI | None:
        from slotwise_foreign.graphs import graph_api

        return graph_api
