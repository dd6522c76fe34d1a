"""The CPU platform's device identity: what Inductor's C++ code is written for (the CPU's
model and flags, the vector ISA ATen picks), so a cache shared with a machine whose CPU
differs, or a process that lowers the ISA, keeps its compiled code apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from slotwise_cpu.platform import CpuPlatform

IDENTITY = """
import json
from slotwise.compilation.cache.compile_cache import CompileCache
from slotwise.compilation.compilers import EagerCompiler
from slotwise.compilation.config import CompilationConfig
from slotwise.platforms import get_current_platform

config = CompilationConfig(level=3, backend="eager", cache_dir="/nonexistent")
cache = CompileCache(config, EagerCompiler(config), factors={"model": "m"})
print(json.dumps({"identity": get_current_platform().device_identity(), "dir": cache.directory}))
"""


def identity_in_a_process(**env: str) -> dict:
    """The identity and a compile cache's folder in a fresh process on the cpu platform."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLOTWISE_", "ATEN_"))}
    result = subprocess.run(
        [sys.executable, "-c", IDENTITY],
        capture_output=True,
        text=True,
        env={**environ, "SLOTWISE_PLATFORM": "cpu", **env},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_the_identity_describes_the_cpu_and_the_isa_aten_runs():
    identity = CpuPlatform().device_identity()
    assert identity["platform"] == "cpu" and identity["device_type"] == "cpu"
    assert identity["torch"] == torch.__version__
    assert identity["name"] == CpuPlatform().get_device_name()
    assert identity["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(identity) == {
        "platform", "device_type", "torch", "name", "machine", "cpu_flags", "aten_cpu_capability"
    }  # fmt: skip
    assert CpuPlatform().device_identity() == identity  # the same in every call


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="this CPU runs ATen's default ISA already; ATEN_CPU_CAPABILITY cannot lower it",
)
def test_a_lowered_isa_is_another_device_with_its_own_compile_cache():
    native = identity_in_a_process()
    lowered = identity_in_a_process(ATEN_CPU_CAPABILITY="default")
    assert lowered["identity"]["aten_cpu_capability"] == "DEFAULT"
    assert {k: v for k, v in lowered["identity"].items() if k != "aten_cpu_capability"} == {
        k: v for k, v in native["identity"].items() if k != "aten_cpu_capability"
    }
    assert lowered["dir"] != native["dir"]
