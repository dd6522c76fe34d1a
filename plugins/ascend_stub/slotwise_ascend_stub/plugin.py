"""Entry point of the ascend_stub plugin.

slotwise imports this module (named in pyproject.toml's entry point) and calls
the functions marked ``@hookimpl``.  Keep it light: no torch, no device work.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from slotwise.plugin_api import PlatformSpec, hookimpl

if TYPE_CHECKING:
    from slotwise.plugin_api import AttentionBackendRegistry, CustomOpRegistry

#: Real NPUs are made visible by an environment variable; so is the stub.
DEVICES_ENV_VAR = "SLOTWISE_ASCEND_STUB_DEVICES"


def probe() -> bool | str:
    """Cheap availability check: read the environment, never touch a device."""
    value = os.environ.get(DEVICES_ENV_VAR, "").strip()
    if not value:
        return f"{DEVICES_ENV_VAR} is not set (set it to the number of stub NPUs, e.g. 1)"
    if not value.isdigit() or int(value) < 1:
        return f"{DEVICES_ENV_VAR}={value!r} is not a positive device count"
    return True


@hookimpl
def slotwise_platforms() -> list[PlatformSpec]:
    return [
        PlatformSpec(
            name="ascend_stub",
            # Imported only if this platform is selected.
            platform_cls="slotwise_ascend_stub.platform:AscendStubPlatform",
            probe=probe,
            priority=150,  # bundled plugins use 0-199 (cpu 0, cuda 100); vendors use 200 and up
            requires_api=">=1.1,<2",  # the slotwise plugin API this was written against
        )
    ]


@hookimpl
def slotwise_register_attention_backends(registry: AttentionBackendRegistry) -> None:
    # A "module:Class" string: the backend module (and torch) is imported only if
    # selected, so registering costs nothing.  register_own: for the platform this
    # plugin declares above, so its name is written once (registry.register(name, ...)
    # adds a backend to another plugin's platform).
    registry.register_own("slotwise_ascend_stub.attention:AscendStubReferenceBackend")


@hookimpl
def slotwise_register_custom_ops(registry: CustomOpRegistry) -> None:
    # The stub's own RMSNorm replaces slotwise's on this platform; model code is unchanged.
    registry.register_own("rms_norm", "slotwise_ascend_stub.custom_ops:rms_norm")
