"""Simulated NPU graphs, plugged into slotwise's static-graph machinery.

slotwise's ``StaticGraphWrapper`` keeps the static-graph contract (warm-ups,
capture per size, input-address checks, one shared pool); a platform only says
how to capture and replay one graph, through a ``GraphAPI``.  A real vendor wraps
its SDK's graph object here.  The stub "captures" by remembering the work; a
replay recomputes it from the captured input tensors and writes into the captured
output tensors, which is exactly what a device graph lets a caller observe: new
data copied into a captured buffer is seen, a tensor elsewhere is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from slotwise.compilation.static_graph_wrapper import (
    StaticGraphPiecewiseBackend,
    StaticGraphWrapper,
)


class StubNpuGraph:
    def __init__(self, api: StubNpuGraphAPI) -> None:
        self.api = api
        self.work: Callable[[], Any] | None = None
        self.outputs: Any = None

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        # A real SDK records kernels into the graph here instead of running them.
        self.api.captures.append({"pool": pool, "quiet": quiet})
        self.work = fn
        self.outputs = fn()
        return self.outputs

    def replay(self) -> None:
        assert self.work is not None, "replay before capture"
        self.api.replays += 1
        fresh = pytree.tree_leaves(self.work())
        for captured, value in zip(pytree.tree_leaves(self.outputs), fresh, strict=True):
            if isinstance(captured, torch.Tensor):
                captured.copy_(value)  # results land where the graph wrote them at capture


class StubNpuGraphAPI:
    """The graph API of the stub NPU; it also counts what it did, for tests and demos."""

    def __init__(self) -> None:
        self._pool = object()  # a real SDK returns its graph memory pool handle
        self.captures: list[dict[str, Any]] = []
        self.replays = 0
        self.weak_refs = 0

    def new_graph(self) -> StubNpuGraph:
        return StubNpuGraph(self)

    def pool(self) -> Any:
        return self._pool

    def synchronize(self) -> None:
        return None  # the simulated device runs synchronously

    def weak_ref(self, outputs: Any) -> Any:
        # On a device, the pool keeps captured memory alive and a weak alias lets it be
        # reused; host memory has no such pool, so the stub keeps strong references.
        self.weak_refs += 1
        return outputs


#: One API (hence one pool) for every graph of the process.
stub_graph_api = StubNpuGraphAPI()


class AscendStubGraphWrapper(StaticGraphWrapper):
    default_graph_api = stub_graph_api


class AscendStubPiecewiseBackend(StaticGraphPiecewiseBackend):
    wrapper_cls = AscendStubGraphWrapper
