"""Splitting a Dynamo graph at the splitting ops (attention) with FX.

Every splitting op gets a piece of its own (consecutive ones share one) and runs
eagerly; the pieces between them are "capturable": compiled, and captured as
static graphs on platforms that have them.  A graph with N separated splitting
ops that starts and ends with other work yields 2N+1 pieces, N+1 capturable.

The attention op's pieces are then inlined into the split graph, each call of the op
replaced by a plain call of its layer's ``LayerAttention`` (``call_attention_directly``):
the same work without torch's dispatcher or a piece's own forward in between.
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
    call_attention_directly(split, [piece for piece in pieces if piece.is_splitting])
    return split, pieces


#: The attention op's arguments, in the schema's order.
_ATTENTION_ARGS = ("q", "k", "v", "out", "layer_name")


def call_attention_directly(split: torch.fx.GraphModule, splitting: list[Piece]) -> None:
    """Inline every splitting piece of ``split`` that calls the attention op, each call
    becoming one of ``LayerAttention(layer_name)(q, k, v, out)``.

    Only pieces whose results nobody reads and that hold nothing but op calls are
    inlined (the attention op returns nothing: it writes ``out``); their ``Piece``
    entries keep the graphs as split, and the split module drops them.  The op stays
    what Dynamo records and what the saved traces hold, so compile-cache and warm-start
    entries are keyed by layer name as before.
    """
    if not splitting:
        return
    from slotwise.attention.ops import UNIFIED_ATTENTION_OP, layer_attention

    def attention_args(node: torch.fx.Node) -> tuple[Any, ...] | None:
        """The op's five arguments at ``node`` (a constant layer name), else None."""
        if node.op != "call_function" or UNIFIED_ATTENTION_OP not in op_names(node.target):
            return None
        missing = _ATTENTION_ARGS[len(node.args) :]
        if any(name not in node.kwargs for name in missing):
            return None
        args = (*node.args, *(node.kwargs[name] for name in missing))
        return args if isinstance(args[-1], str) else None

    pieces = {piece.name: piece for piece in splitting}
    inlined = False
    for outer in list(split.graph.find_nodes(op="call_module")):
        piece = pieces.get(str(outer.target))
        if piece is None or outer.users or outer.kwargs:
            continue
        inner = [n for n in piece.graph.graph.nodes if n.op not in ("placeholder", "output")]
        calls = [attention_args(node) for node in inner]
        if not any(calls) or any(node.op != "call_function" for node in inner):
            continue
        env = dict(zip(piece.graph.graph.find_nodes(op="placeholder"), outer.args, strict=True))
        with split.graph.inserting_before(outer):
            for node, args in zip(inner, calls, strict=True):
                if args is None:
                    env[node] = split.graph.node_copy(node, env.__getitem__)
                    continue
                *tensors, layer_name = torch.fx.map_arg(args, env.__getitem__)
                env[node] = split.graph.call_function(layer_attention(layer_name), tuple(tensors))
                env[node].meta = dict(node.meta)
        split.graph.erase_node(outer)
        split.delete_submodule(piece.name)
        inlined = True
    if inlined:
        split.recompile()
