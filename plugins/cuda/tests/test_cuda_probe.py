"""The CUDA probe: available only when NVML counts a visible GPU, else it says why; the
driver's version, for the GPU's identity in cache keys."""

from __future__ import annotations

import ctypes

import pytest

from slotwise_cuda.probe import driver_version, probe_cuda


class FakeNvml:
    """Stands in for libnvidia-ml: answers with fixed status codes and a device count."""

    def __init__(
        self, init: int = 0, count_status: int = 0, count: int = 2, version_status: int = 0
    ) -> None:
        self.init, self.count_status, self.count = init, count_status, count
        self.version_status = version_status
        self.shutdowns = 0

    def nvmlInit_v2(self) -> int:
        return self.init

    def nvmlDeviceGetCount_v2(self, out) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_uint)).contents.value = self.count
        return self.count_status

    def nvmlSystemGetDriverVersion(self, out, length) -> int:
        ctypes.memmove(out, b"550.54.15\0", min(10, length.value))
        return self.version_status

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


def test_driver_version_is_nvmls_answer():
    nvml = FakeNvml()
    assert driver_version(lambda: nvml) == "550.54.15"
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(
    "nvml, reason",
    [(FakeNvml(init=9), "NVML error 9"), (FakeNvml(version_status=3), "NVML error 3")],
)
def test_driver_version_says_why_nvml_cannot_tell(nvml, reason):
    with pytest.raises(RuntimeError, match=reason):
        driver_version(lambda: nvml)
