"""The direct entry: after its one trace, a compiled model is called without Dynamo.

At levels 2 and 3 every Dynamo guard is dropped, so what a call through ``torch.compile``
still does is overhead: Dynamo's frame evaluation and wrappers, then its transformed
bytecode, which fetches the graph's inputs (the call's arguments, a size or two, and every
weight through nested module lookups), calls the backend's compiled graph and returns its
output. The direct entry is that bytecode as one plain generated function: arguments and
sizes are read from the call, every parameter and buffer is bound once, and the compiled
graph (the split ``GraphModule``'s own ``forward`` at level 3) is called with them in the
order of Dynamo's graph inputs.

Bound weights stay right without a per-call lookup: replacing a parameter, a buffer or a
submodule goes through ``torch.nn``'s registration hooks (attribute assignment,
``register_parameter``/``register_buffer``, ``load_state_dict(assign=True)``), which bump
one process-wide counter; a call that finds the counter moved re-binds every weight
from the model (a replacement with the traced dtype, shape, strides and device) or
refuses with :class:`CompiledModelChangedError` (a changed submodule, or a weight the
graph was not traced for). Changing a weight in place (``copy_``, ``.data``) needs
nothing: the graph reads the bound tensor itself.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from slotwise.compilation import weight_registrations
from slotwise.compilation.trace_paths import (
    Path,
    Unpersistable,
    gatherable,
    lookups,
    path_of,
    path_resolver,
)
from slotwise.errors import SlotwiseError

logger = logging.getLogger(__name__)


class CompiledModelChangedError(SlotwiseError, RuntimeError):
    """A compiled model was changed after its trace in a way its graph cannot follow."""


class CompiledModelInputError(SlotwiseError, TypeError):
    """A call to a compiled model passed arguments unlike those its graph was traced with."""


# -- what the trace tells ------------------------------------------------------------------


def graph_input_paths(graph: fx.GraphModule, trace: Any) -> tuple[list[Path], list[Any]]:
    """Each input of Dynamo's ``graph``, in order: the path it is fetched by and the value
    it was traced with. Unpersistable when one cannot be fetched without Dynamo."""
    paths, values = [], []
    for node in graph.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        value = node.meta.get("example_value")
        if grapharg is None or value is None:
            raise Unpersistable(f"graph input {node.name} has no recorded source")
        path = path_of(grapharg.source, trace)
        if not gatherable(path):
            raise Unpersistable(f"graph input from {grapharg.source.name}")
        paths.append(path)
        values.append(value)
    return paths, values


def check_no_side_effects(tx: Any) -> None:
    """Unpersistable when Dynamo's bytecode does more than call the graph: it replays a
    change the forward makes to an object that outlives the call, or registers hooks."""
    effects = tx.output.side_effects
    if effects.tensor_hooks or effects.save_for_backward:
        raise Unpersistable("forward registers tensor hooks or saves tensors for backward")
    # Objects created during the trace that do not escape (it is checked that the result
    # is the graph's output) need no replay; a change to an existing object does.
    for variable in effects.id_to_variable.values():
        if getattr(variable, "source", None) is not None and effects.is_modified(variable):
            raise Unpersistable(f"forward changes {variable.source.name}, which Dynamo replays")


def traced_inputs_now(graph: fx.GraphModule) -> tuple[list[Path], list[Any]]:
    """:func:`graph_input_paths` of the graph Dynamo is handing its backend right now,
    after checking that its bytecode only fetches inputs and calls the graph."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = InstructionTranslator.current_tx()
    if tx is None:
        raise Unpersistable("no Dynamo trace in progress")
    check_no_side_effects(tx)
    return graph_input_paths(graph, tx.output)


def output_kind(result: Any, graph_outputs: Sequence[Any]) -> str:
    """How Dynamo's bytecode built the forward's ``result`` from the graph's outputs:
    "single" or "tuple"; Unpersistable when it built something else."""
    if len(graph_outputs) == 1 and result is graph_outputs[0]:
        return "single"
    if (
        type(result) is tuple
        and len(result) == len(graph_outputs)
        and all(a is b for a, b in zip(result, graph_outputs, strict=True))
    ):
        return "tuple"
    raise Unpersistable("forward's result is not the graph's output as is")


# -- the entry -----------------------------------------------------------------------------

_WEIGHT_DICTS = ("_parameters", "_buffers")


def _is_weight(path: Path, self_name: str) -> bool:
    """Whether ``path`` is a parameter or buffer of the model or a submodule, reached
    through ``_modules`` only: what the registration hooks see replaced."""
    if path[0] != ("local", self_name) or len(path) < 3 or len(path) % 2 == 0:
        return False
    steps = path[1:]
    modules, (weight_dict, item) = steps[:-2], steps[-2:]
    return (
        weight_dict[0] == "attr"
        and weight_dict[1] in _WEIGHT_DICTS
        and item[0] == "item"
        and all(step == ("attr", "_modules") for step in modules[0::2])
        and all(step[0] == "item" for step in modules[1::2])
    )


def _expression(path: Path, self_name: str, arguments: set[str]) -> str:
    """Python text reading ``path`` in the generated entry: from an argument, the module
    (``_slotwise_self``), the model module's globals or an imported module."""
    kind, name = path[0]
    if kind == "local" and name == self_name:
        text = "_slotwise_self"
    elif kind == "local" and name in arguments:
        text = name
    elif kind == "global":
        text = f"_slotwise_G[{name!r}]"
    elif kind == "import":
        text = f"_slotwise_M[{name!r}]"
    else:
        raise Unpersistable(f"a graph input comes from {kind} {name!r}")
    return text + lookups(path[1:])


def _plain_callable(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """A GraphModule's generated ``forward`` (no ``Module.__call__`` around it), else
    ``compiled`` itself."""
    if isinstance(compiled, fx.GraphModule):
        from torch.fx._lazy_graph_module import _LazyGraphModule

        if isinstance(compiled, _LazyGraphModule):
            compiled.real_recompile()
        return compiled.forward
    return compiled


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-dimensional tensor"
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        return "an int"
    return f"a {type(value).__name__}"


def _same_layout(traced: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether ``value`` has the dtype, device, static sizes and strides ``traced`` had."""

    def fits(expected: Sequence[Any], actual: Sequence[int]) -> bool:
        return len(expected) == len(actual) and all(
            not isinstance(e, int) or e == a for e, a in zip(expected, actual, strict=True)
        )

    return (
        value.dtype == traced.dtype
        and value.device == traced.device
        and fits(traced.shape, value.shape)
        and fits(traced.stride(), value.stride())
    )


class DirectEntry:
    """Calls the compiled graph of ``module`` as Dynamo's transformed bytecode would,
    without Dynamo: one generated function with ``forward``'s parameters that passes the
    call's tensors and sizes and the bound weights to ``compiled``.

    ``paths``/``traced``: each graph input's path and traced value, as
    :func:`graph_input_paths` returns them; ``output``: what :func:`output_kind` said;
    ``scope``: the globals of the model's module (for inputs read from globals).
    Unpersistable when an input cannot be fetched this way.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        signature: inspect.Signature,
        compiled: Callable[..., Any],
        paths: Sequence[Path],
        traced: Sequence[Any],
        output: str,
        scope: dict[str, Any],
    ) -> None:
        self.module = module
        self.signature = signature
        self.scope = scope
        self.name = f"{type(module).__qualname__}.forward"
        self.single_output = output == "single"
        #: What the entry calls: the split graph, or the FULL graph wrapper around it.
        self.graph = compiled
        parameters = list(signature.parameters.values())
        self_name = parameters[0].name
        clash = [p.name for p in parameters if p.name.startswith("_slotwise")]
        if clash:
            raise Unpersistable(f"forward has parameters named {clash}")
        arguments = {p.name for p in parameters[1:]}
        self._namespace: dict[str, Any] = {
            "__builtins__": {},
            "_slotwise_graph": _plain_callable(compiled),
            "_slotwise_self": module,
            "_slotwise_G": scope,
            "_slotwise_M": sys.modules,
            "_slotwise_D": {p.name: p.default for p in parameters},
        }
        # (the global name it is bound to, its path, its traced value), for every weight.
        self._weights: list[tuple[str, Path, Any]] = []
        # (its path, its traced value), for every input read from the call's arguments.
        self._from_arguments: list[tuple[Path, Any]] = []
        expressions = []
        for index, (path, value) in enumerate(zip(paths, traced, strict=True)):
            if _is_weight(path, self_name):
                name = f"_slotwise_w{index}"
                self._weights.append((name, path, value))
                expressions.append(name)
                continue
            expressions.append(_expression(path, self_name, arguments))
            if path[0][0] == "local" and path[0][1] != self_name:
                self._from_arguments.append((path, value))
        source = (
            f"def forward({_parameter_list(parameters[1:])}):\n"
            f"    return _slotwise_graph({''.join(e + ', ' for e in expressions)})\n"
        )
        exec(compile(source, f"<slotwise direct entry of {self.name}>", "exec"), self._namespace)
        self._run: Callable[..., Any] = self._namespace["forward"]
        self._traced_modules = list(module.named_modules(remove_duplicate=False))
        self._bound_at = -1
        weight_registrations.watch()
        self._bind()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._bound_at != weight_registrations.count():
            self._bind()
        try:
            outputs = self._run(*args, **kwargs)
        except Exception as err:
            self._check_arguments(args, kwargs, err)
            raise
        return outputs[0] if self.single_output else tuple(outputs)

    def _bind(self) -> None:
        """Bind every weight the graph reads, as the model holds it now; refuse a model
        whose submodules changed or whose weight no longer fits the graph."""
        registrations = weight_registrations.count()
        modules = list(self.module.named_modules(remove_duplicate=False))
        changed = _changed_modules(modules, self._traced_modules)
        if changed:
            raise CompiledModelChangedError(
                f"submodules of the compiled {type(self.module).__qualname__} were replaced, "
                f"added or removed after its trace ({', '.join(changed)}):"
                " its graph runs the code of the modules it was traced with. Build (and "
                "compile) a new model instead, or replace only parameters and buffers"
            )
        rebound = []
        for name, path, traced in self._weights:
            value = _weight_at(self.module, path)
            if value is self._namespace.get(name):
                continue
            weight = ".".join(str(step[1]) for step in path[2::2])
            if not isinstance(value, torch.Tensor):
                raise CompiledModelChangedError(
                    f"{weight} of the compiled {type(self.module).__qualname__} was removed "
                    f"or set to {_describe(value)} after its trace, which reads it: "
                    "assign a tensor of the traced dtype, shape and device, or build a new model"
                )
            if not _same_layout(traced, value):
                raise CompiledModelChangedError(
                    f"{weight} of the compiled {type(self.module).__qualname__} was replaced "
                    f"by a {value.dtype} tensor of shape {tuple(value.shape)}, strides "
                    f"{value.stride()} on {value.device}; its graph was traced for "
                    f"{traced.dtype}, {tuple(traced.shape)}, {traced.stride()} on "
                    f"{traced.device}. Assign a tensor laid out as traced, or build a new model"
                )
            self._namespace[name] = value
            rebound.append(weight)
        if rebound and self._bound_at != -1:
            logger.info(
                "compiled %s: re-bound %d replaced weights (%s)",
                type(self.module).__qualname__,
                len(rebound),
                ", ".join(rebound[:5]) + (", ..." if len(rebound) > 5 else ""),
            )
        self._bound_at = registrations

    def _check_arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], err: Exception
    ) -> None:
        """After a failed call: raise one clear error when the arguments are unlike the
        traced ones (the failure is theirs); return when they are alike."""
        try:
            bound = self.signature.bind(self.module, *args, **kwargs)
        except TypeError as bind_err:
            raise CompiledModelInputError(f"{self.name}: {bind_err}") from None
        bound.apply_defaults()
        resolve = path_resolver(dict(bound.arguments), self.scope)
        for path, traced in self._from_arguments:
            argument = resolve(path[:1])
            try:
                value = resolve(path)
            except Exception:  # noqa: BLE001 - the argument lacks what the trace read
                raise CompiledModelInputError(
                    f"{self.name} was traced reading {_text(path)}, which this call's "
                    f"{path[0][1]!r} ({_describe(argument)}) does not have: its one trace "
                    "serves every call, so pass what the first call passed"
                ) from err
            if _describe(value) != _describe(traced):
                raise CompiledModelInputError(
                    f"{self.name} was traced with {_describe(traced)} as {_text(path)} and "
                    f"called with {_describe(value)}: its one trace serves every call, so "
                    "pass what the first call passed"
                ) from err


def _weight_at(module: torch.nn.Module, path: Path) -> Any:
    """The value at a weight's path (see :func:`_is_weight`), None when it is gone."""
    owner: Any = module
    for _, key in path[2:-2:2]:
        owner = owner._modules.get(key)
        if owner is None:
            return None
    return getattr(owner, path[-2][1]).get(path[-1][1])


def _changed_modules(
    now: list[tuple[str, torch.nn.Module]], traced: list[tuple[str, torch.nn.Module]]
) -> list[str]:
    """The outermost names whose module was replaced, added or removed since the trace."""
    if len(now) == len(traced) and all(
        a is b or (a[0] == b[0] and a[1] is b[1]) for a, b in zip(now, traced, strict=True)
    ):
        return []
    before = dict(traced)
    after = dict(now)
    changed = [
        name
        for name in sorted(before.keys() | after.keys())
        if before.get(name) is not after.get(name)
    ]
    return [
        name
        for name in changed
        if not any(name.startswith(f"{outer}.") for outer in changed if outer != name)
    ]


def _text(path: Path) -> str:
    text = str(path[0][1])
    for kind, value in path[1:]:
        text += {"attr": f".{value}", "item": f"[{value!r}]", "size": f".size({value})"}.get(
            kind, f".{kind}({value!r})"
        )
    return text


def _parameter_list(parameters: Sequence[inspect.Parameter]) -> str:
    """``forward``'s parameters (without ``self``) as source text, defaults read from
    ``_slotwise_D``, annotations left out."""
    kind = inspect.Parameter
    parts: list[str] = []
    for index, parameter in enumerate(parameters):
        if parameter.kind is kind.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
        elif parameter.kind is kind.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
        else:
            if parameter.kind is kind.KEYWORD_ONLY and not any(
                p.kind in (kind.KEYWORD_ONLY, kind.VAR_POSITIONAL) for p in parameters[:index]
            ):
                parts.append("*")
            default = "" if parameter.default is kind.empty else f"=_slotwise_D[{parameter.name!r}]"
            parts.append(parameter.name + default)
        if parameter.kind is kind.POSITIONAL_ONLY and (
            index + 1 == len(parameters) or parameters[index + 1].kind is not kind.POSITIONAL_ONLY
        ):
            parts.append("/")
    return ", ".join(parts)
