"""What compiled code is specialised to on this machine, for cache keys and folders.

Inductor writes its C++ code for the vector ISA it picks on this CPU and its device code
for the platform's device, while a cache under the home folder may be shared by several
machines (a network home) or copied to another one. Loaded on a CPU that picks another
ISA, or on another device generation, such code computes wrong numbers without an
error, so whatever is keyed on compiled code is keyed on these too.

The host CPU is read here, on every platform: host code runs on it whatever the device.
The device is described by its platform (``Platform.device_identity``); the core never
probes a vendor's device itself.
"""

from __future__ import annotations

import functools
import hashlib
import platform

from slotwise.platforms import Platform, PlatformError, get_current_platform


@functools.cache
def cpu_identity() -> str:
    """Hash of the architecture and the host CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as file:
            lines = [
                line.strip()
                for line in file
                if line.startswith(("model name", "flags", "Features", "cpu model"))
            ]
    except OSError:
        lines = []
    described = "\n".join([platform.machine(), *sorted(set(lines))])
    return hashlib.sha256(described.encode("utf-8")).hexdigest()


def device_identity(device_platform: Platform | None = None) -> dict[str, str]:
    """``Platform.device_identity()`` of ``device_platform`` (default: the current one),
    checked: a plugin returning anything but a dict of strings would key every cache on
    an unstable text."""
    owner = device_platform or get_current_platform()
    identity = owner.device_identity()
    if not isinstance(identity, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in identity.items()
    ):
        raise PlatformError(
            f"platform {owner.name!r} ({type(owner).__name__}).device_identity() returned "
            f"{type(identity).__name__} {identity!r:.200}; it must return a dict of strings "
            "(name, capability, driver and runtime versions), e.g. by adding to "
            "super().device_identity()"
        )
    return identity
