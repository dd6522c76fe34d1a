"""The CUDA platform's device identity: the current GPU's name and compute capability, the
driver and the CUDA runtime, which Inductor's Triton kernels are compiled for."""

from __future__ import annotations

import re

import pytest
import torch

from slotwise_cuda.platform import CudaPlatform


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_identity_names_the_gpu_its_capability_driver_and_runtime():
    identity = CudaPlatform().device_identity()
    major, minor = torch.cuda.get_device_capability()
    assert identity["platform"] == "cuda" and identity["device_type"] == "cuda"
    assert identity["name"] == torch.cuda.get_device_name()
    assert identity["capability"] == f"{major}.{minor}"
    assert identity["cuda_runtime"] == torch.version.cuda
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", identity["driver"]), identity
    assert CudaPlatform().device_identity() == identity
