"""Warm starts: a process whose model was traced before rebuilds it without Dynamo.

Levels 2 and 3 keep no Dynamo guard, so what Dynamo contributes after its one trace is
small: the FX graph, and bytecode that fetches the graph's inputs (the call's arguments,
the module's weights, a size or two) and returns the graph's output. The cold process
saves the graph with the symbolic sizes of its inputs (``torch.fx``'s ``GraphPickler``)
and where each input comes from; a warm process loads that, runs the slotwise backend on
it (splitting, and the pieces from the compile cache) and calls it through the direct
entry (:mod:`slotwise.compilation.direct_entry`), as a cold process does after its trace.

A trace is only right for what Dynamo assumed while making it: the Python constants it
baked into the graph (a config object's eps, a global read from the environment, a
closure variable, a class attribute), the types and identities of what it inlined, each
tensor's dtype, device, static sizes and strides, which weights are one tensor, torch's
global state. Dynamo writes every such assumption down as a guard. slotwise keeps none
of them at run time, but the cold process turns each into a check on the same path
(from the call's arguments, the model module's globals or an imported module), and a
warm process runs every check before it uses the entry. A guard that cannot be written
as such a check makes the trace unpersistable: it is not saved (logged once), and every
process traces it. Dynamo also folds a few process facts into graphs without any guard
(the distributed rank and world size, which accelerators exist); those are recorded and
compared too, as are the hashes of every source file Dynamo traced.

The entry lives in the compile cache folder of the model's graph (same key: slotwise,
torch and config versions, model source, platform, compiler); its name adds the module's
structure, so differently built instances of one class keep separate entries.

This module is the store: it records the trace, saves it in the compile cache and
rebuilds the forward from it. Guards become checks in
:mod:`slotwise.compilation.warm_start.checks`; the paths that checks and graph inputs are
fetched by are :mod:`slotwise.compilation.trace_paths`; the facts Dynamo bakes in
without a guard are :mod:`slotwise.compilation.warm_start.facts`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from slotwise import envs
from slotwise.compilation.cache.compile_cache import CompileCache
from slotwise.compilation.direct_entry import (
    DirectEntry,
    check_no_side_effects,
    graph_input_paths,
    output_kind,
)
from slotwise.compilation.trace_paths import Unpersistable, gatherer
from slotwise.compilation.warm_start.checks import aliased, failed_check, guard_checks
from slotwise.compilation.warm_start.facts import plain_repr, unguarded_facts

logger = logging.getLogger(__name__)

ENTRY_PREFIX = "dynamo-trace"
_FORMAT = "slotwise-warm-start-v2"

_DYNAMO_ATTRIBUTES = frozenset(
    {"shape_env", "_param_name_to_source", "_source_to_user_stacks", "compile_subgraph_reason"}
)
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def warm_start_enabled() -> bool:
    return not envs.flag("SLOTWISE_DISABLE_WARM_START")


class WarmStartStore:
    """Saves and loads the Dynamo trace of one model instance in its compile cache.

    The cold process calls :meth:`capture` (from the backend, with Dynamo's graph),
    :meth:`record_guards` (from the guard filter, with Dynamo's guards of that graph)
    and :meth:`save` (once the first call returned); a warm process calls :meth:`load`.
    """

    def __init__(
        self,
        cache: CompileCache,
        module: torch.nn.Module,
        forward: Callable,
        dynamic_arg_dims: dict[str, int | list[int]],
    ) -> None:
        self.cache = cache
        self.module = module
        self.signature = inspect.signature(forward)
        self.scope: dict[str, Any] = forward.__globals__
        # Which sizes the trace keeps dynamic: a trace made with a static size is wrong
        # for any other, and the functional compile() takes these outside the source.
        self.dynamic_arg_dims = {
            name: [dims] if isinstance(dims, int) else list(dims)
            for name, dims in sorted(dynamic_arg_dims.items())
        }
        self.entry_name = f"{ENTRY_PREFIX}-{module_structure_hash(module)[:24]}"
        self._captured: dict[str, Any] | None = None
        self._trace: Any = None  # Dynamo's OutputGraph, from capture to record_guards

    # -- the cold process --------------------------------------------------------------

    def capture(self, graph: fx.GraphModule) -> None:
        """Called by the backend with Dynamo's graph: keep what a warm start needs."""
        try:
            self._captured, self._trace = _capture(graph)
            self._captured["dynamic_arg_dims"] = self.dynamic_arg_dims
        except Exception as err:  # noqa: BLE001 - never fail the compile over the record
            self._not_saved(err)

    def record_guards(self, guards: Sequence[Any]) -> None:
        """Called by the guard filter with every guard of the captured trace: each becomes
        a check a warm process runs, or the trace is not saved."""
        trace, self._trace = self._trace, None
        if self._captured is None or trace is None:
            return
        try:
            self._captured["checks"] = guard_checks(guards, trace)
        except Exception as err:  # noqa: BLE001 - never fail the compile over the record
            self._not_saved(err)

    def save(self, result: Any, graph_outputs: list[Any] | None) -> None:
        """Write the captured trace, once the first call through it returned ``result``
        from the graph's ``graph_outputs``."""
        captured, self._captured, self._trace = self._captured, None, None
        if captured is None or graph_outputs is None:
            return
        try:
            if "checks" not in captured:
                raise Unpersistable("Dynamo did not hand over the trace's guards")
            captured["output"] = output_kind(result, graph_outputs)
            captured["facts"] = unguarded_facts()
            payload = _dumps(captured)
        except Exception as err:  # noqa: BLE001 - an unsaved trace only costs the next start
            self._not_saved(err)
            return
        self.cache.write_named(self.entry_name, payload)

    def _not_saved(self, err: Exception) -> None:
        """Log once why this trace is not saved: at info level when the model needs what
        a warm start cannot check, as a warning when recording it failed."""
        self._captured = self._trace = None
        name = type(self.module).__qualname__
        if isinstance(err, Unpersistable):
            logger.info(
                "warm start: the trace of %s is not saved (%s); warm processes trace it", name, err
            )
        else:
            logger.warning(
                "warm start: the trace of %s could not be recorded (%s: %s); warm processes "
                "trace it",
                name,
                type(err).__name__,
                err,
            )

    # -- the warm process --------------------------------------------------------------

    def load(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        build: Callable[[fx.GraphModule, list[Any]], Callable[..., Any]],
    ) -> Callable[..., Any] | None:
        """The forward rebuilt from the saved trace, or None (then Dynamo traces)."""
        payload = self.cache.read_named(self.entry_name)
        if payload is None:
            return None
        from torch._guards import TracingContext, tracing

        try:
            arguments = self._arguments(args, kwargs)
            fake_mode = _fake_mode()
            record = _loads(payload, fake_mode)
            stale = self._stale_because(record, arguments)
            if not stale:
                gather = gatherer(record["paths"], self.scope)
                stale = aliased(gather(arguments))
            if stale:
                logger.info("warm start: saved trace not used (%s); tracing with Dynamo", stale)
                return None
            with tracing(TracingContext(fake_mode)):
                _propagate_meta(record["graph"], record["inputs"], fake_mode)
                compiled = build(record["graph"], list(record["inputs"]))
            entry = DirectEntry(
                self.module,
                self.signature,
                compiled,
                record["paths"],
                record["inputs"],
                record["output"],
                self.scope,
            )
        except Exception as err:  # noqa: BLE001 - whatever failed, tracing is correct
            logger.warning(
                "warm start: saved trace %s could not be used (%s: %s); tracing with Dynamo "
                "and overwriting it",
                self.entry_name,
                type(err).__name__,
                err,
            )
            return None
        logger.info("warm start: model rebuilt from its saved trace, without Dynamo")
        return entry

    def _stale_because(self, record: Any, arguments: dict[str, Any]) -> str:
        """Why the saved trace may not fit this call and process, or "" when it does."""
        if not isinstance(record, dict) or record.get("format") != _FORMAT:
            raise ValueError("not a slotwise warm-start entry")
        if record["dynamic_arg_dims"] != self.dynamic_arg_dims:
            return (
                f"dynamic_arg_dims {self.dynamic_arg_dims} differ from the traced "
                f"{record['dynamic_arg_dims']}"
            )
        for filename, digest in record["files"].items():
            if _file_hash(filename) != digest:
                return f"{filename} changed"
        facts, saved = unguarded_facts(), record["facts"]
        changed = sorted(key for key in facts.keys() | saved if facts.get(key) != saved.get(key))
        if changed:
            return f"{', '.join(changed)} differ from the traced process"
        if _global_hooks_set():
            return "torch.nn global module hooks are set"
        return failed_check(record["checks"], arguments, self.scope)

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The forward frame's locals on entry, as Dynamo saw them: ``L`` of its guards."""
        bound = self.signature.bind(self.module, *args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


def module_structure_hash(module: torch.nn.Module) -> str:
    """Hash naming the entry of ``module``: each submodule's path and class, each weight's
    dtype, shape, strides and device, and plain attributes (sizes, eps, flags). It keeps a
    2-layer and a 16-layer model from overwriting each other's trace; whether a trace
    fits is decided by its checks, not by this name."""
    digest = hashlib.sha256()
    for name, sub in module.named_modules(remove_duplicate=False):
        digest.update(f"module {name} {type(sub).__module__}.{type(sub).__qualname__}\n".encode())
        for kind, tensors in (("param", sub._parameters), ("buffer", sub._buffers)):
            for key, tensor in tensors.items():
                digest.update(f"{kind} {key} {_tensor_meta(tensor)}\n".encode())
        for key, value in sorted(vars(sub).items()):
            if key.startswith("_"):
                continue
            digest.update(f"attr {key} {plain_repr(value)}\n".encode())
    return digest.hexdigest()


def _tensor_meta(tensor: torch.Tensor | None) -> str:
    if tensor is None:
        return "None"
    return (
        f"{type(tensor).__name__} {tensor.dtype} {tuple(tensor.shape)} {tensor.stride()} "
        f"{tensor.device} {tensor.requires_grad}"
    )


# -- capture: the graph and where its inputs come from ------------------------------------


def _capture(graph: fx.GraphModule) -> tuple[dict[str, Any], Any]:
    """The graph, its inputs' symbolic values, their paths and the traced files; and
    Dynamo's OutputGraph, which :func:`guard_checks` needs to read the guards."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = InstructionTranslator.current_tx()
    if tx is None:
        raise Unpersistable("no Dynamo trace in progress")
    check_no_side_effects(tx)
    _check_no_global_hooks()
    paths, inputs = graph_input_paths(graph, tx.output)
    for node in graph.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            raise Unpersistable(f"the graph holds {node.op} {node.target!r}")
    captured = {
        "format": _FORMAT,
        "graph": _portable(graph),
        "inputs": inputs,
        "paths": paths,
        "files": _traced_files(),
        "python": list(sys.version_info[:3]),
    }
    return captured, tx.output


def _portable(graph: fx.GraphModule) -> fx.GraphModule:
    """A module sharing ``graph``'s nodes without Dynamo's bookkeeping (its shape
    environment and input sources), which cannot be pickled and is not needed to run."""
    shell = fx.GraphModule.__new__(fx.GraphModule)
    shell.__dict__ = {k: v for k, v in graph.__dict__.items() if k not in _DYNAMO_ATTRIBUTES}
    shell.__dict__["meta"] = {}
    return shell


def _check_no_global_hooks() -> None:
    if _global_hooks_set():
        raise Unpersistable("torch.nn global module hooks are set")


def _global_hooks_set() -> bool:
    from torch.nn.modules import module as nn_module

    return any(getattr(nn_module, name, None) for name in _GLOBAL_HOOKS)


def _traced_files() -> dict[str, str]:
    from torch._guards import TracingContext

    codes = TracingContext.get_traced_code() or []
    files = {}
    for code in codes:
        digest = _file_hash(code.co_filename)
        if digest is None:
            raise Unpersistable(f"traced code from {code.co_filename}, which is not a file")
        files[code.co_filename] = digest
    return files


def _file_hash(filename: str) -> str | None:
    try:
        with open(filename, "rb") as file:
            return hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None


# -- loading the graph ---------------------------------------------------------------------


class _MetaPropagator(fx.Interpreter):
    def run_node(self, node: fx.Node) -> Any:
        result = super().run_node(node)
        node.meta["example_value"] = result
        return result


def _propagate_meta(graph: fx.GraphModule, inputs: list[Any], fake_mode: Any) -> None:
    """Give every node the fake ``example_value`` Dynamo's trace gave it: the split
    copies them onto the pieces' inputs, which the piecewise backends are built from."""
    from torch.fx.experimental.proxy_tensor import enable_python_dispatcher

    with fake_mode, enable_python_dispatcher():
        _MetaPropagator(graph).run(*inputs)


def _pickle_options() -> Any:
    from torch.fx._graph_pickler import Options

    # Node metadata is rebuilt by fake propagation on load (views among Dynamo's fake
    # values do not pickle); the inputs' symbolic values travel on their own.
    return Options(ops_filter=None, node_metadata_key_filter=lambda key: False)


def _dumps(captured: dict[str, Any]) -> bytes:
    from torch.fx._graph_pickler import GraphPickler

    header = json.dumps({"format": _FORMAT, "python": captured["python"]}).encode() + b"\n"
    return header + GraphPickler.dumps(captured, _pickle_options())


def _loads(payload: bytes, fake_mode: Any) -> dict[str, Any]:
    from torch.fx._graph_pickler import GraphPickler

    header, _, body = payload.partition(b"\n")
    meta = json.loads(header)
    if meta.get("format") != _FORMAT or meta.get("python") != list(sys.version_info[:3]):
        raise ValueError(f"entry written by {meta}, not by this Python and format")
    return GraphPickler.loads(body, fake_mode)  # type: ignore[return-value]


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(shape_env=ShapeEnv())
