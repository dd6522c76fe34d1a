"""``CudaPlatform``: NVIDIA GPUs through torch.cuda, with CUDA graphs.

torch is imported inside methods only: this module is imported when the platform
is selected, and selection must not create a CUDA context.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from slotwise.plugin_api import Platform

if TYPE_CHECKING:
    from slotwise_cuda.graph_api import CudaGraphAPI

logger = logging.getLogger("slotwise")


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"
    default_compile_backend = "inductor"
    custom_op_key = "cuda"

    def device_count(self, **kwargs: Any) -> int:
        import torch

        return torch.cuda.device_count()

    def get_device_name(self, device_id: int = 0, **kwargs: Any) -> str:
        import torch

        return torch.cuda.get_device_name(device_id)

    def get_device_capability(self, device_id: int = 0, **kwargs: Any) -> tuple[int, int]:
        import torch

        return torch.cuda.get_device_capability(device_id)

    def device_identity(self, **kwargs: Any) -> dict[str, str]:
        """The current GPU's name and compute capability, the driver and the CUDA runtime:
        Inductor's Triton kernels are compiled for that architecture and toolchain."""
        import torch

        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {
            **super().device_identity(),
            "name": properties.name,
            "capability": f"{properties.major}.{properties.minor}",
            "driver": _driver_version(),
            "cuda_runtime": torch.version.cuda or "none",
        }

    def total_memory(self, device_id: int = 0, **kwargs: Any) -> int:
        import torch

        return torch.cuda.get_device_properties(device_id).total_memory

    def current_memory_usage(self, device_id: int = 0, **kwargs: Any) -> int:
        import torch

        return torch.cuda.memory_allocated(device_id)

    def set_device(self, device_id: int, **kwargs: Any) -> None:
        import torch

        torch.cuda.set_device(device_id)

    def synchronize(self, **kwargs: Any) -> None:
        import torch

        torch.cuda.synchronize()

    def get_graph_api(self, **kwargs: Any) -> CudaGraphAPI:
        from slotwise_cuda.graph_api import cuda_graph_api

        return cuda_graph_api


@functools.cache
@functools.cache
def _driver_version() -> str:
    """The NVIDIA driver's version, asked once per process."""
    from slotwise_cuda.probe import driver_version

    try:
        return driver_version()
    except (OSError, RuntimeError) as error:
        logger.warning(
            "the NVIDIA driver's version is unknown (%s); compiled code is cached for this "
            "GPU and CUDA runtime without it",
            error,
        )
        return "unknown"
