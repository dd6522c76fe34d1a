"""Entry point of the CUDA plugin: registers the ``cuda`` platform."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.platforms import PlatformSpec
from slotwise.plugins import hookimpl
from slotwise_cuda.probe import probe_cuda

if TYPE_CHECKING:
    from slotwise.attention.registry import AttentionBackendRegistry


@hookimpl
def slotwise_platforms() -> list[PlatformSpec]:
    return [
        PlatformSpec(
            name="cuda",
            platform_cls="slotwise_cuda.platform:CudaPlatform",
            probe=probe_cuda,
            priority=100,
            requires_api=">=1.0,<2",
        )
    ]


@hookimpl
def slotwise_register_attention_backends(registry: AttentionBackendRegistry) -> None:
    registry.register("cuda", "slotwise_cuda.attention:TritonPagedBackend")
