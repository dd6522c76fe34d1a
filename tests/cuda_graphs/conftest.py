"""A CPU stand-in for the CUDA graph API that keeps the static-graph contract.

A replay recomputes the captured work from the captured input tensors and writes
into the captured output storage, so a test sees exactly what a real graph does:
new data in a captured buffer is picked up, a new tensor elsewhere is not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

from slotwise.platforms import Platform, use_platform
from slotwise_cuda.graph_wrapper import CudaGraphWrapper
from slotwise_cuda.piecewise_backend import CudaPiecewiseBackend


class CpuGraph:
    def __init__(self, api: CpuGraphAPI) -> None:
        self.api = api
        self.work: Callable[[], Any] | None = None
        self.outputs: Any = None

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        self.api.captures.append({"pool": pool, "quiet": quiet})
        self.work = fn
        self.outputs = fn()
        return self.outputs

    def replay(self) -> None:
        assert self.work is not None
        self.api.replays += 1
        fresh = pytree.tree_leaves(self.work())
        for captured, value in zip(pytree.tree_leaves(self.outputs), fresh, strict=True):
            if isinstance(captured, torch.Tensor):
                captured.copy_(value)


@dataclass
class CpuGraphAPI:
    captures: list[dict[str, Any]] = field(default_factory=list)
    weak_refs: int = 0
    replays: int = 0
    _pool: object = field(default_factory=object)

    def new_graph(self) -> CpuGraph:
        return CpuGraph(self)

    def pool(self) -> object:
        return self._pool

    def synchronize(self) -> None:
        return None

    def weak_ref(self, outputs: Any) -> Any:
        # CPU memory has no graph pool keeping it alive, so the stand-in keeps strong
        # references and only records that the backend asked.
        self.weak_refs += 1
        return outputs


class CpuGraphPlatform(Platform):
    """A graph platform running the CUDA plugin's backends on the CPU."""

    name = "cpu_graphs"
    device_type = "cpu"
    supports_static_graph = True
    default_compile_backend = "eager"

    def __init__(self, api: CpuGraphAPI) -> None:
        super().__init__()
        self.api = api

    def get_piecewise_backend_cls(self, **kwargs: Any) -> Any:
        return functools.partial(CudaPiecewiseBackend, graph_api=self.api)

    def get_static_graph_wrapper_cls(self, **kwargs: Any) -> Any:
        return functools.partial(CudaGraphWrapper, graph_api=self.api)

    def graph_pool(self, **kwargs: Any) -> Any:
        return self.api.pool()

    def synchronize(self, **kwargs: Any) -> None:
        self.api.synchronize()

    def get_attention_backend_cls(self, selected: str | None = None, **requirements: Any) -> type:
        from slotwise_cpu.attention import CpuSdpaBackend

        return CpuSdpaBackend


@pytest.fixture
def graph_api() -> Any:
    api = CpuGraphAPI()
    with use_platform(CpuGraphPlatform(api)):
        yield api
