"""Entry point of the CUDA plugin: registers the ``cuda`` platform."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.plugin_api import PlatformSpec, hookimpl
from slotwise_cuda.probe import probe_cuda

if TYPE_CHECKING:
    from slotwise.plugin_api import AttentionBackendRegistry, CustomOpRegistry

#: Core custom ops with a Triton implementation in slotwise_cuda.custom_ops.
TRITON_CUSTOM_OPS = ("rms_norm", "silu_and_mul", "rotary_embedding")


@hookimpl
def slotwise_platforms() -> list[PlatformSpec]:
    return [
        PlatformSpec(
            name="cuda",
            platform_cls="slotwise_cuda.platform:CudaPlatform",
            probe=probe_cuda,
            priority=100,
            requires_api=">=1.4,<2",  # AttentionMetadata.split, new in 1.4
        )
    ]


@hookimpl
def slotwise_register_attention_backends(registry: AttentionBackendRegistry) -> None:
    registry.register_own("slotwise_cuda.attention:TritonPagedBackend")


@hookimpl
def slotwise_register_custom_ops(registry: CustomOpRegistry) -> None:
    for op_name in TRITON_CUSTOM_OPS:
        registry.register_own(op_name, f"slotwise_cuda.custom_ops:{op_name}")
