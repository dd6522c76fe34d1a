"""``CudaPiecewiseBackend``: compile-and-dispatch plus a CUDA graph per capture size."""

from __future__ import annotations

from slotwise.compilation.static_graph_wrapper import StaticGraphPiecewiseBackend
from slotwise_cuda.graph_wrapper import CudaGraphWrapper


class CudaPiecewiseBackend(StaticGraphPiecewiseBackend):
    wrapper_cls = CudaGraphWrapper
