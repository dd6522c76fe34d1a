"""CUDA graphs behind slotwise's ``GraphAPI`` (``CudaPlatform.get_graph_api()``).

Everything that touches ``torch.cuda`` graph machinery is here; the bookkeeping
of the static-graph contract is the core's ``StaticGraphWrapper``, so it is tested
on the CPU with a stand-in API that keeps the same contract (``tests/static_graphs``).
"""

from __future__ import annotations

import contextlib
import gc
import unittest.mock
from collections.abc import Callable
from typing import Any

from slotwise.plugin_api import weak_ref_tensors


class CudaGraph:
    def __init__(self) -> None:
        import torch

        self._graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        import torch

        with contextlib.ExitStack() as stack:
            if quiet:
                stack.enter_context(unittest.mock.patch.object(gc, "collect", lambda *a: 0))
                stack.enter_context(unittest.mock.patch.object(torch.cuda, "empty_cache", _noop))
            stack.enter_context(torch.cuda.graph(self._graph, pool=pool))
            return fn()

    def replay(self) -> None:
        self._graph.replay()


class CudaGraphAPI:
    """Real CUDA graphs on the current device and stream."""

    def __init__(self) -> None:
        self._pool: Any = None

    def new_graph(self) -> CudaGraph:
        return CudaGraph()

    def pool(self) -> Any:
        if self._pool is None:
            import torch

            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def weak_ref(self, outputs: Any) -> Any:
        return weak_ref_tensors(outputs)


def _noop() -> None:
    return None


#: The process's CUDA graph API: one pool shared by every piece and wrapper.
cuda_graph_api = CudaGraphAPI()
