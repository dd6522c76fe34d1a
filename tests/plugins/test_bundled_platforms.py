"""The cpu, cuda and ascend_stub platforms and their probes."""

from __future__ import annotations

import ctypes
import os

import pytest

from slotwise_ascend_stub.platform import AscendStubPlatform
from slotwise_ascend_stub.plugin import probe as ascend_probe
from slotwise_cpu.platform import CpuPlatform
from slotwise_cuda.probe import probe_cuda


def test_cpu_platform_counts_the_cpus_this_process_may_use():
    cpu = CpuPlatform()
    assert cpu.device_count() == len(os.sched_getaffinity(0))
    assert cpu.total_memory() > 256 * 1024**2
    assert 0 < cpu.current_memory_usage() < cpu.total_memory()
    assert cpu.get_device_name()
    assert cpu.dist_backend == "gloo" and cpu.get_graph_api() is None
    with pytest.raises(ValueError, match="does not exist"):
        cpu.set_device(cpu.device_count())


class FakeNvml:
    """Stands in for libnvidia-ml: answers with fixed status codes and a device count."""

    def __init__(self, init: int = 0, count_status: int = 0, count: int = 2) -> None:
        self.init, self.count_status, self.count = init, count_status, count
        self.shutdowns = 0

    def nvmlInit_v2(self) -> int:
        return self.init

    def nvmlDeviceGetCount_v2(self, out) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_uint)).contents.value = self.count
        return self.count_status

    def nvmlShutdown(self) -> int:
        self.shutdowns += 1
        return 0


def test_cuda_probe_is_available_when_nvml_reports_devices():
    nvml = FakeNvml(count=2)
    assert probe_cuda(lambda: nvml, environ={}) is True
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(
    "nvml, environ, reason",
    [
        (FakeNvml(count=0), {}, "reports no GPU"),
        (FakeNvml(init=9), {}, "did not initialise (NVML error 9)"),
        (FakeNvml(count_status=3), {}, "cannot count devices"),
        (FakeNvml(), {"CUDA_VISIBLE_DEVICES": ""}, "hides every GPU"),
        (FakeNvml(), {"CUDA_VISIBLE_DEVICES": "-1"}, "hides every GPU"),
    ],
)
def test_cuda_probe_explains_why_it_is_unavailable(nvml, environ, reason):
    answer = probe_cuda(lambda: nvml, environ=environ)
    assert isinstance(answer, str) and reason in answer


def test_cuda_probe_without_a_driver_says_so():
    def missing():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert probe_cuda(missing, environ={}) == (
        "no NVIDIA driver found (libnvidia-ml.so.1 cannot be loaded)"
    )


@pytest.mark.parametrize(
    "value, expected",
    [(None, "is not set"), ("0", "not a positive"), ("two", "not a positive"), ("2", True)],
)
def test_ascend_stub_is_available_only_with_its_device_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("SLOTWISE_ASCEND_STUB_DEVICES", raising=False)
    else:
        monkeypatch.setenv("SLOTWISE_ASCEND_STUB_DEVICES", value)
    answer = ascend_probe()
    assert answer is True if expected is True else expected in answer


def test_ascend_stub_devices_follow_the_variable(monkeypatch):
    monkeypatch.setenv("SLOTWISE_ASCEND_STUB_DEVICES", "3")
    npu = AscendStubPlatform()
    assert npu.device_count() == 3
    assert npu.device_control_env_var == "SLOTWISE_ASCEND_STUB_DEVICES"
    graph_api = npu.get_graph_api()
    assert graph_api is not None and npu.get_graph_api() is graph_api  # one pool per process
    with pytest.raises(ValueError, match="SLOTWISE_ASCEND_STUB_DEVICES=3"):
        npu.set_device(3)
