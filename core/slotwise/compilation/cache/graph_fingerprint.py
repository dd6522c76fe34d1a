"""Structural fingerprints of graph pieces: the traced piece in the compile cache's key.

A transformer's layers become pieces that differ only in names, so nodes are named by
position and symbolic sizes by order, while everything that can change the compiled code
is kept; object ids and addresses never enter the hash.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import types
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

_SCALARS = (type(None), bool, int, float, complex, str)
_TORCH_ENUMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class UnfingerprintableGraph(TypeError):
    """The piece holds something whose behaviour a hash cannot capture (a closure, a
    leaf module, an opaque object); such a piece is compiled without caching."""


def fingerprint(
    graph: fx.GraphModule, example_inputs: Sequence[Any], runtime_shape: int | None
) -> str:
    """Hex digest equal for structurally identical pieces compiled for the same inputs;
    ``runtime_shape`` chooses what their sizes are read from (the key holds it, not this)."""
    hasher = _Fingerprinter()
    for value in _shape_sources(graph, example_inputs, runtime_shape):
        hasher.add("input", hasher.example(value))
    hasher.add_graph(graph)
    return hasher.digest.hexdigest()


def _shape_sources(
    graph: fx.GraphModule, example_inputs: Sequence[Any], runtime_shape: int | None
) -> list[Any]:
    """What the compiled code's shapes depend on, one per input: the placeholders'
    symbolic sizes for the general shape, the real inputs for a specialised compile."""
    placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
    if runtime_shape is not None or len(placeholders) != len(example_inputs):
        return list(example_inputs)
    sources = []
    for node, value in zip(placeholders, example_inputs, strict=True):
        traced = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            usable = isinstance(traced, torch.Tensor)
        else:
            usable = isinstance(traced, _SYMBOLIC)
        sources.append(traced if usable else value)
    return sources


class _Fingerprinter:
    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        # Symbols renamed by first appearance, so inputs sharing a size still share it.
        self.symbols: dict[sympy.Symbol, sympy.Symbol] = {}

    def add(self, *parts: str) -> None:
        for part in parts:
            data = part.encode("utf-8")
            # Length-prefixed, so no two part sequences encode to the same bytes.
            self.digest.update(len(data).to_bytes(8, "little") + data)

    def example(self, value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return self.tensor_meta(value)
        if isinstance(value, _SYMBOLIC):
            return f"sym:{self.symbolic(value)}"
        if isinstance(value, _SCALARS):
            return f"{type(value).__name__}:{value!r}"
        raise UnfingerprintableGraph(f"example input of type {type(value).__qualname__}")

    def symbolic(self, value: torch.SymInt | torch.SymFloat | torch.SymBool) -> str:
        expr = value.node.expr
        for symbol in sorted(expr.free_symbols, key=str):
            self.symbols.setdefault(symbol, sympy.Symbol(f"sym{len(self.symbols)}"))
        return str(expr.xreplace(self.symbols))

    def size(self, value: int | torch.SymInt) -> str:
        return self.symbolic(value) if isinstance(value, torch.SymInt) else str(value)

    def tensor_meta(self, tensor: torch.Tensor) -> str:
        kind = "tensor" if isinstance(tensor, _PLAIN_TENSORS) else type(tensor).__qualname__
        parts = [
            kind,
            str(tensor.dtype),
            str(tensor.device),
            str(tensor.layout),
            f"requires_grad={tensor.requires_grad}",
            "sizes=" + ",".join(self.size(s) for s in tensor.shape),
        ]
        if tensor.layout == torch.strided:
            parts.append("strides=" + ",".join(self.size(s) for s in tensor.stride()))
            parts.append(f"offset={self.size(tensor.storage_offset())}")
        return "(" + " ".join(parts) + ")"

    def tensor_contents(self, tensor: torch.Tensor) -> str:
        if type(tensor) not in _PLAIN_TENSORS or tensor.layout != torch.strided:
            raise UnfingerprintableGraph(
                f"constant {type(tensor).__qualname__} with layout {tensor.layout}"
            )
        if tensor.is_meta:
            raise UnfingerprintableGraph("constant tensor on the meta device has no contents")
        with unset_fake_temporarily():
            data = tensor.detach().to("cpu").contiguous()
            raw = ctypes.string_at(data.data_ptr(), data.numel() * data.element_size())
        return f"{self.tensor_meta(tensor)}:{hashlib.sha256(raw).hexdigest()}"

    def add_graph(self, graph: fx.GraphModule) -> None:
        # The codegen decides the calling convention; a pytree one carries input/output specs
        # (its first field, the argument names, is left out like every other name).
        codegen = graph.graph._codegen
        pytree_info = getattr(codegen, "pytree_info", None)
        specs = None if pytree_info is None else (pytree_info.in_spec, pytree_info.out_spec)
        self.add("codegen", type(codegen).__qualname__, repr(specs))
        positions: dict[fx.Node, int] = {}
        for node in graph.graph.nodes:
            positions[node] = len(positions)
            self.add(node.op, self.target(graph, node))
            self.add("args", self.literal(node.args, positions))
            kwargs = {name: node.kwargs[name] for name in sorted(node.kwargs)}
            self.add("kwargs", self.literal(kwargs, positions))
        self.add("end_graph")

    def target(self, graph: fx.GraphModule, node: fx.Node) -> str:
        if node.op in ("placeholder", "output"):
            return ""
        if node.op == "call_method":
            return str(node.target)
        if node.op == "call_function":
            return _callable_name(node.target)
        attribute = _fetch(graph, str(node.target))
        if isinstance(attribute, fx.GraphModule):
            self.add_graph(attribute)
            return "graph_module"
        if node.op == "call_module":
            raise UnfingerprintableGraph(
                f"call_module {node.target!r} of {type(attribute).__qualname__}: a leaf "
                "module's state cannot be hashed reliably"
            )
        return self.literal(attribute, {})

    def literal(self, value: Any, positions: dict[fx.Node, int]) -> str:
        if isinstance(value, fx.Node):
            return f"%{positions[value]}"
        if isinstance(value, _SCALARS):
            return f"{type(value).__name__}:{value!r}"
        if isinstance(value, _TORCH_ENUMS):
            return f"{type(value).__name__}:{value}"
        if isinstance(value, _SYMBOLIC):
            return f"sym:{self.symbolic(value)}"
        if isinstance(value, torch.Tensor):
            return self.tensor_contents(value)
        if isinstance(value, enum.Enum):
            return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
        if value is Ellipsis:
            return "..."
        if isinstance(value, slice):
            items = (value.start, value.stop, value.step)
            return "slice(" + ",".join(self.literal(v, positions) for v in items) + ")"
        if isinstance(value, (tuple, list)):
            items = ",".join(self.literal(item, positions) for item in value)
            return f"{type(value).__name__}({items})"
        if isinstance(value, dict):
            items = ",".join(
                f"{self.literal(key, positions)}:{self.literal(item, positions)}"
                for key, item in value.items()
            )
            return f"{type(value).__name__}({items})"
        raise UnfingerprintableGraph(f"value of type {type(value).__qualname__}")


def _callable_name(target: Any) -> str:
    """A name that identifies what the call does, never the object's address."""
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target.name()}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"op:{target._qualified_op_name}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order:{target.name()}"
    owner = getattr(target, "__self__", None)
    qualname = getattr(target, "__qualname__", None)
    if (
        qualname is None
        or getattr(target, "__closure__", None) is not None
        or not (owner is None or isinstance(owner, (types.ModuleType, type)))
    ):
        # A closure or bound method behaves by state that its name does not show.
        raise UnfingerprintableGraph(f"call of {target!r}")
    return f"{getattr(target, '__module__', None)}.{qualname}"


def _fetch(graph: fx.GraphModule, path: str) -> Any:
    value: Any = graph
    for name in path.split("."):
        value = getattr(value, name)
    return value
