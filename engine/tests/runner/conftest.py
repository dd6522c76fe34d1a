"""The model runner with static graphs on the CPU: the core's recorded graphs stand in
for a device's, the bundled plugins' attention backends run the attention.

``RecordedGraphAPI`` keeps the contract of a device graph: a replay runs again the ops
its capture recorded, on the captured tensors, with the host values of the capture, and
writes into the captured outputs, so a test sees exactly what a real graph does: new
data in a captured buffer is picked up, a new tensor elsewhere is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from slotwise.compilation.static_graphs.recorded_graph import RecordedGraphAPI
from slotwise.platforms import Platform, use_platform
from slotwise.testing.triton_interpreter import (  # before triton picks its interpreter
    ON_GPU,
    helpers_interpreted,
    import_interpreted,
    interpreting,
)


class CpuGraphPlatform(Platform):
    """A graph platform on the CPU: recorded graphs, the CPU plugin's attention unless a
    test names another backend."""

    name = "cpu_graphs"
    device_type = "cpu"
    default_compile_backend = "eager"

    def __init__(self, api: RecordedGraphAPI, attention_backend: type | None = None) -> None:
        super().__init__()
        self.api = api
        self.attention_backend = attention_backend

    def get_graph_api(self, **kwargs: Any) -> RecordedGraphAPI:
        return self.api

    def synchronize(self, **kwargs: Any) -> None:
        return None

    def get_attention_backend_cls(self, selected: str | None = None, **requirements: Any) -> type:
        from slotwise_cpu.attention import CpuSdpaBackend

        return self.attention_backend or CpuSdpaBackend


@pytest.fixture
def graph_api() -> Iterator[RecordedGraphAPI]:
    api = RecordedGraphAPI()
    with use_platform(CpuGraphPlatform(api)):
        yield api


@pytest.fixture
def graph_platform_with() -> Iterator[Callable[[type], RecordedGraphAPI]]:
    """``use(attention_backend)`` makes a CPU graph platform with that backend current
    for the test and returns its graph API."""
    with contextlib.ExitStack() as stack:

        def use(attention_backend: type) -> RecordedGraphAPI:
            api = RecordedGraphAPI()
            stack.enter_context(use_platform(CpuGraphPlatform(api, attention_backend)))
            return api

        yield use


@pytest.fixture
def interpreted_triton() -> Iterator[None]:
    """Runs the CUDA plugin's Triton kernels on CPU tensors, in Triton's interpreter."""
    if ON_GPU:
        pytest.skip("on a GPU triton compiles for the device; test_runner_on_cuda_graphs covers it")
    if not helpers_interpreted():
        pytest.fail(
            "triton.language was imported before slotwise.testing.triton_interpreter set it up"
        )
    import_interpreted("slotwise_cuda.kernels.attention")
    with interpreting():
        yield
