"""``CpuPiecewiseBackend``: the CPU's level-3 pieces, with their linear layers on the
plugin's small-GEMM op.

Why here: the pieces are where a platform sees the model's matrix products before they
are compiled, so swapping ``F.linear`` for ``torch.ops.slotwise_cpu.linear`` needs no
change to model code.  Only products whose weights the kernel takes are swapped (the
op itself sends prefill-sized calls on to torch), never those of weights that require
grad (the op has no backward), and the piece is then compiled as any other, through the
compile cache.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from slotwise.plugin_api import CompilationConfig, CompiledPiecewiseBackend
from slotwise_cpu import linear

logger = logging.getLogger("slotwise")

_LINEAR_FUNCTIONS = (torch._C._nn.linear, F.linear)


class CpuPiecewiseBackend(CompiledPiecewiseBackend):
    """slotwise's compiled piecewise backend, after ``route_linear_layers``."""

    def __init__(
        self, graph: torch.fx.GraphModule, config: CompilationConfig, **kwargs: Any
    ) -> None:
        swapped = route_linear_layers(graph, kwargs["example_inputs"])
        if swapped:
            logger.debug(
                "slotwise_cpu: %d linear layers of piece %s on the small-GEMM op",
                swapped,
                kwargs["piece_index"],
            )
        super().__init__(graph, config, **kwargs)


def route_linear_layers(graph: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    """Point every ``F.linear`` of ``graph`` whose weight the kernel takes at
    ``slotwise_cpu::linear``, in place; returns how many."""
    values = dict(
        zip(
            (node for node in graph.graph.nodes if node.op == "placeholder"),
            example_inputs,
            strict=False,
        )
    )
    swapped = 0
    for node in graph.graph.nodes:
        if node.op != "call_function" or node.target not in _LINEAR_FUNCTIONS:
            continue
        x, weight, bias = _linear_arguments(node)
        example = values.get(weight) if isinstance(weight, torch.fx.Node) else None
        if example is None:
            example = (
                weight.meta.get("example_value") if isinstance(weight, torch.fx.Node) else None
            )
        if not isinstance(example, torch.Tensor) or not linear.runs_kernel(example.dtype):
            continue
        if example.requires_grad:
            continue  # the op has no backward: a trainable weight stays on F.linear
        node.target = torch.ops.slotwise_cpu.linear.default
        node.args, node.kwargs = (x, weight, bias), {}
        swapped += 1
    if swapped:
        graph.recompile()
    return swapped


def _linear_arguments(node: torch.fx.Node) -> tuple[Any, Any, Any]:
    names = ("input", "weight", "bias")
    values = list(node.args) + [None] * (3 - len(node.args))
    for index, name in enumerate(names):
        if name in node.kwargs:
            values[index] = node.kwargs[name]
    return values[0], values[1], values[2]
