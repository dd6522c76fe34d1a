"""The CPU platform: what it reports about the machine this process runs on."""

from __future__ import annotations

import os

import pytest

from slotwise_cpu.platform import CpuPlatform


def test_cpu_platform_counts_the_cpus_this_process_may_use():
    cpu = CpuPlatform()
    assert cpu.device_count() == len(os.sched_getaffinity(0))
    assert cpu.total_memory() > 256 * 1024**2
    assert 0 < cpu.current_memory_usage() < cpu.total_memory()
    assert cpu.get_device_name()
    assert cpu.dist_backend == "gloo" and cpu.get_graph_api() is None
    with pytest.raises(ValueError, match="does not exist"):
        cpu.set_device(cpu.device_count())
