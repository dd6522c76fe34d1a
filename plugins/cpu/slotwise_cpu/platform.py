"""``CpuPlatform``: runs everything on the host CPU, without static graphs.

Devices are the CPUs this process may run on (its affinity mask), so the count
follows ``taskset``/cgroup limits rather than the machine's size.  Nothing here
imports torch at module level: resolving to the CPU platform stays cheap.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotwise.plugin_api import CompilationConfig, CompilationLevel, Platform

if TYPE_CHECKING:
    import torch


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    device_control_env_var = ""
    default_compile_backend = "inductor"
    custom_op_key = "cpu"

    def device_count(self, **kwargs: Any) -> int:
        return len(os.sched_getaffinity(0))

    def get_device_name(self, device_id: int = 0, **kwargs: Any) -> str:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        import platform  # not at module level: its regexes cost resolution 7 ms

        return platform.processor() or platform.machine() or "CPU"

    def get_device_capability(self, device_id: int = 0, **kwargs: Any) -> None:
        return None  # compute capabilities are a GPU notion

    def device_identity(self, **kwargs: Any) -> dict[str, str]:
        """The CPU's model, architecture and feature flags, and the vector ISA ATen picks
        (``ATEN_CPU_CAPABILITY`` can lower it): Inductor writes its C++ code for them."""
        import torch

        return {
            **super().device_identity(),
            **_cpu_description(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }

    def total_memory(self, device_id: int = 0, **kwargs: Any) -> int:
        """Physical memory, or the cgroup limit when the process runs under a lower one."""
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        try:
            limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        except OSError:
            return physical
        return min(physical, int(limit)) if limit.isdigit() else physical

    def current_memory_usage(self, device_id: int = 0, **kwargs: Any) -> int:
        """Resident set size of this process."""
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")

    def set_device(self, device_id: int, **kwargs: Any) -> None:
        count = self.device_count()
        if not 0 <= device_id < count:
            raise ValueError(f"cpu device {device_id} does not exist; this process has {count}")

    def synchronize(self, **kwargs: Any) -> None:
        return None  # CPU kernels run synchronously

    def get_communicator_cls(self, **kwargs: Any) -> type:
        from slotwise_cpu.communicator import CpuCommunicator

        return CpuCommunicator

    def advise_resident_memory(self, tensors: Sequence[torch.Tensor], **kwargs: Any) -> None:
        """Move them onto transparent huge pages (``slotwise_cpu.huge_pages``)."""
        from slotwise_cpu import huge_pages

        huge_pages.advise(tensors)

    def check_and_update_config(self, config: CompilationConfig, **kwargs: Any) -> None:
        """At level 3, compile each model as one graph unless ``splitting_ops`` is set.

        Splitting at attention exists so that the pieces between attention calls can be
        captured as static graphs; the CPU has none, so the split would only add a
        compiled piece's call and its Python wrappers per attention layer and keep
        Inductor from fusing across them (0.7 ms of a 5 ms batch-1 decode step of the
        ``small`` preset, docs/benchmarks.md).  The attention op runs inside the graph
        as an opaque call.  A subclass that adds static graphs keeps the split.
        """
        if (
            config.level == CompilationLevel.PIECEWISE
            and config.splitting_ops is None
            and not config.use_inductor_graph_partition
            and self.get_graph_api() is None
        ):
            config.splitting_ops = []

    def get_piecewise_backend_cls(self, **kwargs: Any) -> type | None:
        """Level-3 pieces whose linear products of a few rows run the plugin's C kernel; None
        (slotwise's backend, which captures) for a subclass that adds static graphs."""
        if self.get_graph_api() is not None:
            return None
        from slotwise_cpu.piecewise import CpuPiecewiseBackend

        return CpuPiecewiseBackend


@functools.cache
@functools.cache
def _cpu_description() -> dict[str, str]:
    """The CPU's model name, the architecture and a hash of the feature flags (hundreds of
    them, one line per core in /proc/cpuinfo), read once per process: every compile
    cache a model opens asks for the device identity."""
    import platform  # not at module level: its regexes cost resolution 7 ms

    models: set[str] = set()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu model"):
                models.add(value.strip())
            elif key in ("flags", "Features"):
                flags.add(" ".join(sorted(value.split())))
    except OSError:
        pass
    return {
        "name": " / ".join(sorted(models)) or platform.processor() or "unknown",
        "machine": platform.machine(),
        "cpu_flags": hashlib.sha256("\n".join(sorted(flags)).encode()).hexdigest()[:16],
    }
