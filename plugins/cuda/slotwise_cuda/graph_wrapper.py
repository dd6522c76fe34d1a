"""``CudaGraphWrapper``: the core's static-graph wrapper on real CUDA graphs."""

from __future__ import annotations

from slotwise.compilation.static_graph_wrapper import StaticGraphWrapper
from slotwise_cuda.graph_api import cuda_graph_api


class CudaGraphWrapper(StaticGraphWrapper):
    default_graph_api = cuda_graph_api
