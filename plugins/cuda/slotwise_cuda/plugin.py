"""Entry point of the CUDA plugin: registers the ``cuda`` platform."""

from __future__ import annotations

from slotwise.platforms import PlatformSpec
from slotwise.plugins import hookimpl
from slotwise_cuda.probe import probe_cuda


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
