"""Entry point of the CPU plugin: registers the ``cpu`` platform, its attention backend and
its replacement of the ``logits`` custom op."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.plugin_api import PlatformSpec, hookimpl

if TYPE_CHECKING:
    from slotwise.plugin_api import AttentionBackendRegistry, CustomOpRegistry


def probe() -> bool:
    return True  # a CPU is always there


@hookimpl
def slotwise_platforms() -> list[PlatformSpec]:
    return [
        PlatformSpec(
            name="cpu",
            platform_cls="slotwise_cpu.platform:CpuPlatform",
            probe=probe,
            priority=0,
            requires_api=">=1.5,<2",  # CompilationLevel, in the plugin API from 1.5
        )
    ]


@hookimpl
def slotwise_register_attention_backends(registry: AttentionBackendRegistry) -> None:
    registry.register_own("slotwise_cpu.attention:CpuSdpaBackend")


@hookimpl
def slotwise_register_custom_ops(registry: CustomOpRegistry) -> None:
    registry.register_own("logits", "slotwise_cpu.logits:logits")
