"""What compiled code is specialised to on this machine, for cache keys and folders.

Code compiled for one CPU's vector ISA or one device generation computes wrong numbers
silently on another, and a cache may be shared, so compiled code is keyed on these.  The
device is described by its platform (``Platform.device_identity``).
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
