"""What compiled code is specialised to on this machine, for cache keys and folders.

Inductor writes its C++ code for the vector ISA it picks on this CPU and its Triton code
for this GPU, while a cache under the home folder may be shared by several machines (a
network home) or copied to another one. Loaded on a CPU that picks another ISA, such code
computes wrong numbers without an error, so whatever is keyed on compiled code is keyed
on these too.
"""

from __future__ import annotations

import functools
import hashlib
import platform

import torch


@functools.cache
def cpu_identity() -> str:
    """Hash of the architecture and the CPU's model and feature flags."""
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


def gpu_identity() -> list[str] | None:
    """Name and compute capability of each visible GPU, None without one."""
    if not torch.cuda.is_available():
        return None
    return [
        f"{torch.cuda.get_device_name(index)} {torch.cuda.get_device_capability(index)}"
        for index in range(torch.cuda.device_count())
    ]
