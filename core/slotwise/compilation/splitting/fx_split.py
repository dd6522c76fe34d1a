"""Splitting a Dynamo graph at the splitting ops (attention) with FX.

Every splitting op gets a piece of its own (consecutive ones share one) and runs
eagerly; the pieces between them are "capturable": compiled, and captured as
static graphs on platforms that have them.  A graph with N separated splitting
ops that starts and ends with other work yields 2N+1 pieces, N+1 capturable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module


@dataclass
class Piece:
    """One submodule of the split graph."""

    name: str  # attribute name on the split module, e.g. "submod_2"
    index: int  # position in execution order
    graph: torch.fx.GraphModule
    is_splitting: bool

    @property
    def is_capturable(self) -> bool:
        return not self.is_splitting


def op_names(target: Any) -> tuple[str, ...]:
    """The names a call target answers to: ("ns::op", "ns::op.overload"), or ().

    Dynamo records custom ops as packets (``torch.ops.ns.op``), which dispatch to
    the ``default`` overload, so a packet also answers to "ns::op.default".
    """
    if isinstance(target, torch._ops.OpOverloadPacket):
        base = target._qualified_op_name
        return (base, f"{base}.default")
    if isinstance(target, torch._ops.OpOverload):
        base = target._schema.name
        return (base, f"{base}.{target._overloadname}")
    return ()


def is_splitting_node(node: torch.fx.Node, splitting_ops: frozenset[str]) -> bool:
    return node.op == "call_function" and any(
        name in splitting_ops for name in op_names(node.target)
    )


def split_graph(
    graph: torch.fx.GraphModule, splitting_ops: list[str]
) -> tuple[torch.fx.GraphModule, list[Piece]]:
    """Split ``graph`` at ``splitting_ops``, keeping the original order of all nodes.

    Keeping the order matters: ops such as attention write into buffers allocated
    earlier (mutation), which a reordering split could move past their readers.
    """
    wanted = frozenset(splitting_ops)
    partition_of: dict[torch.fx.Node, int] = {}
    splitting_partitions: set[int] = set()
    partition = 0
    previous_was_split = False
    for node in graph.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_splitting_node(node, wanted):
            if not previous_was_split:
                partition += 1
                splitting_partitions.add(partition)
            previous_was_split = True
        elif previous_was_split:
            partition += 1
            previous_was_split = False
        partition_of[node] = partition

    split = split_module(graph, None, lambda node: partition_of[node], keep_original_order=True)
    pieces = []
    for index, (name, module) in enumerate(split.named_children()):
        partition_id = int(name.removeprefix("submod_"))
        pieces.append(
            Piece(
                name=name,
                index=index,
                graph=module,
                is_splitting=partition_id in splitting_partitions,
            )
        )
    return split, pieces
