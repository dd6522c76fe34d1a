"""Is there a usable NVIDIA GPU, and which driver runs it?  Answered through NVML,
never through torch.cuda.

Creating a CUDA context in the parent process breaks every ``fork`` after it, so
the probe asks the driver's management library (loaded with ctypes) how many
devices exist, and honours ``CUDA_VISIBLE_DEVICES`` itself.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from typing import Any

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS = 0
#: NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: room for the driver version and its NUL.
NVML_DRIVER_VERSION_LENGTH = 80


def load_nvml() -> Any:
    return ctypes.CDLL(NVML_LIBRARY)


def probe_cuda(
    load_library: Callable[[], Any] = load_nvml, environ: Mapping[str, str] = os.environ
) -> bool | str:
    """True when the driver reports at least one visible device, else the reason."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    try:
        nvml = load_library()
    except OSError:
        return f"no NVIDIA driver found ({NVML_LIBRARY} cannot be loaded)"
    status = nvml.nvmlInit_v2()
    if status != NVML_SUCCESS:
        return f"the NVIDIA driver did not initialise (NVML error {status})"
    try:
        count = ctypes.c_uint(0)
        status = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if status != NVML_SUCCESS:
            return f"the NVIDIA driver cannot count devices (NVML error {status})"
        if count.value == 0:
            return "the NVIDIA driver reports no GPU"
    finally:
        nvml.nvmlShutdown()
    return True


def driver_version(load_library: Callable[[], Any] = load_nvml) -> str:
    """The NVIDIA driver's version ("550.54.15"), through NVML; OSError or RuntimeError
    saying why where NVML cannot tell."""
    nvml = load_library()
    status = nvml.nvmlInit_v2()
    if status != NVML_SUCCESS:
        raise RuntimeError(f"the NVIDIA driver did not initialise (NVML error {status})")
    try:
        version = ctypes.create_string_buffer(NVML_DRIVER_VERSION_LENGTH)
        status = nvml.nvmlSystemGetDriverVersion(version, ctypes.c_uint(len(version)))
        if status != NVML_SUCCESS:
            raise RuntimeError(f"NVML cannot read the driver's version (NVML error {status})")
    finally:
        nvml.nvmlShutdown()
    return version.value.decode("ascii", errors="replace")
