"""``CudaPiecewiseBackend``: compile-and-dispatch plus a CUDA graph per capture size."""

from __future__ import annotations

from typing import Any

import torch.fx

from slotwise.compilation.config import CompilationConfig, GraphMode
from slotwise.compilation.piecewise_backend import CompiledPiecewiseBackend
from slotwise_cuda.graph_api import GraphAPI
from slotwise_cuda.graph_wrapper import CudaGraphWrapper


class CudaPiecewiseBackend(CompiledPiecewiseBackend):
    """Runs one capturable piece; in PIECEWISE steps through its graph for the size.

    ``graph_api`` defaults to real CUDA graphs; tests pass a CPU stand-in.  Sizes
    outside ``capture_sizes`` (above the largest, in particular) run the compiled
    piece without a graph.
    """

    def __init__(
        self,
        graph: torch.fx.GraphModule,
        config: CompilationConfig,
        *,
        graph_api: GraphAPI | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(graph, config, **kwargs)
        self.graph_wrapper = CudaGraphWrapper(
            self.run_compiled,
            config,
            runtime_mode=GraphMode.PIECEWISE,
            example_inputs=kwargs["example_inputs"],
            piece_index=self.piece_index,
            num_pieces=self.num_pieces,
            graph_api=graph_api,
        )

    def run_compiled(self, *args: Any) -> Any:
        return self.compiled_for(self.runtime_size(args), args)(*args)

    def __call__(self, *args: Any) -> Any:
        return self.graph_wrapper(*args)
