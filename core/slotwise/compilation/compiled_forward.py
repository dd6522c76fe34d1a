"""The compiled forward of one model instance, for levels 1 to 3."""

from __future__ import annotations

import inspect
import logging
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from slotwise.compilation.cache.cache_key import traced_code
from slotwise.compilation.cache.inductor_cache_dir import place_inductor_cache
from slotwise.compilation.compile_counters import counters
from slotwise.compilation.compile_lock import compile_lock
from slotwise.compilation.config import CompilationConfig, CompilationLevel
from slotwise.compilation.platform_defaults import apply_platform_defaults
from slotwise.compilation.static_graphs.graph_modes import attention_backends_of
from slotwise.errors import SlotwiseError
from slotwise.platforms import Platform, get_current_platform

if TYPE_CHECKING:
    # Imported where first needed: they import Dynamo (over a second of start-up), which
    # an eager model never runs.
    from slotwise.compilation.splitting.dynamo_backends import TraceOnceBackend
    from slotwise.compilation.warm_start.store import WarmStartStore

logger = logging.getLogger(__name__)


def drop_all_guards(guards: list[Any]) -> list[bool]:
    """Keep no Dynamo guard: the one trace serves every later call (levels 2 and 3)."""
    return [False] * len(guards)


def _guard_filter(warm_start: WarmStartStore | None) -> Callable[[list[Any]], list[bool]]:
    """:func:`drop_all_guards`, after handing the guards to the warm-start store: they are
    what a later process must check before it reuses this trace."""
    if warm_start is None:
        return drop_all_guards

    def record_and_drop(guards: list[Any]) -> list[bool]:
        warm_start.record_guards(guards)
        return drop_all_guards(guards)

    return record_and_drop


def prepare_config(
    config: CompilationConfig,
    platform: Platform,
    attention_backends: Sequence[type] | None = None,
    *,
    compiled: bool = True,
) -> CompilationConfig:
    """A copy of ``config`` adapted by the platform, with every change logged once.

    ``attention_backends``: those of the model's layers, which decide the default graph
    mode (None: the one the platform selects by default). ``compiled=False``: the model
    runs uncompiled (``TORCH_COMPILE_DISABLE=1``) and so captures no graphs.

    What the platform's hook and the backend default change is logged here rather than
    trusted to each platform, so a plugin that forgets to log cannot change a setting
    silently; the core's own graph-mode changes are logged once, with their reason, by
    ``graph_modes.settle_graph_mode``.
    """
    adapted = config.replace()
    before = adapted.to_dict()
    platform.check_and_update_config(adapted)
    after_hook = adapted.to_dict()
    apply_platform_defaults(platform, adapted, attention_backends, compiled=compiled)
    # The graph mode as the hook left it: later changes are settle_graph_mode's, logged there.
    after = {**adapted.to_dict(), "graph_mode": after_hook["graph_mode"]}
    for key, value in after.items():
        if before[key] != value:
            logger.info(
                "platform %s set compilation %s: %r -> %r", platform.name, key, before[key], value
            )
    return adapted


def torch_compile_disabled() -> bool:
    """Whether torch.compile is switched off in this process: ``TORCH_COMPILE_DISABLE=1``,
    which torch reads when Dynamo loads, or ``torch._dynamo.config.disable`` set since.
    Dynamo's config is asked only where it is loaded already, so an eager start never
    imports it."""
    dynamo_config = sys.modules.get("torch._dynamo.config")
    if dynamo_config is not None:
        return bool(dynamo_config.disable)
    return os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1"


def _fresh_function(function: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``function`` with its own code object.

    Dynamo keeps compiled code per code object; with every guard dropped, two
    instances of one class would otherwise share the first instance's trace.
    """
    return types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


def arguments_to_trace(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments, each tensor that is a view or shares memory with an earlier
    one replaced by a copy. Dynamo traces arguments that share memory as one input and
    guards on it: with the guards dropped, later calls passing distinct tensors would
    reuse that trace. And a trace of a view (a runner's step buffers are views) cannot be
    recorded for a warm start."""
    seen: set[int] = set()

    def to_trace(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        storage = value.untyped_storage().data_ptr()
        if storage == 0:  # no memory to share
            return value
        if storage in seen or value._is_view():
            # An inference tensor's copy is one too, any other tensor's is not: the
            # copy has the dispatch keys of what later calls pass.
            with torch.inference_mode(value.is_inference()):
                return value.clone()
        seen.add(storage)
        return value

    return tuple(map(to_trace, args)), {name: to_trace(v) for name, v in kwargs.items()}


class CompiledForward:
    """Compiles ``forward`` of ``module`` on first call; later calls run the compiled code.

    Levels 2 and 3 trace once, with ``dynamic_arg_dims`` marked dynamic and every guard
    dropped, so no later size causes a guard check or a recompile.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        forward: Callable[..., Any],
        config: CompilationConfig,
        dynamic_arg_dims: dict[str, int | list[int]],
    ) -> None:
        self.module = module
        self.forward = forward
        self.platform = get_current_platform()
        # A model without slotwise Attention layers is judged by the platform's default backend.
        backends = attention_backends_of(module) or None
        eager = torch_compile_disabled()
        self.config = prepare_config(config, self.platform, backends, compiled=not eager)
        # Read now, so a bad SLOTWISE_DISABLE_COMPILE_CACHE fails here and not inside Dynamo.
        self.config.cache_enabled  # noqa: B018
        self.dynamic_arg_dims = dynamic_arg_dims
        self.signature = inspect.signature(forward)
        self.compiled: Callable[..., Any] | None = None
        if eager:
            # As torch.compile does under TORCH_COMPILE_DISABLE=1, and vLLM with it: the
            # model's own forward, at every level (levels 2 and 3 would otherwise find no
            # frame compiled under fullgraph=True and fail).
            level = self.config.level
            logger.warning(
                "TORCH_COMPILE_DISABLE=1: %s runs eagerly instead of at compilation level "
                "%d (%s), and captures no static graphs (graph_mode NONE); unset "
                "TORCH_COMPILE_DISABLE to compile it",
                type(module).__qualname__,
                level.value,
                level.name,
            )
            self.compiled = types.MethodType(forward, module)

    def _backend(self) -> TraceOnceBackend:
        from slotwise.compilation.splitting.dynamo_backends import TraceOnceBackend
        from slotwise.compilation.warm_start.store import WarmStartStore, warm_start_enabled

        backend = TraceOnceBackend(
            self.config,
            self.platform,
            traced_code=traced_code(self.module),
            piecewise=self.config.level == CompilationLevel.PIECEWISE,
        )
        if warm_start_enabled():
            cache = backend.first_cache()
            if cache.persistent:
                backend.warm_start = WarmStartStore(
                    cache, self.module, self.forward, self.dynamic_arg_dims
                )
        return backend

    def _compile(self, backend: TraceOnceBackend | None) -> Callable[..., Any]:
        from slotwise.compilation.splitting.dynamo_backends import as_is_backend

        bound = types.MethodType(_fresh_function(self.forward), self.module)
        if backend is None:
            return torch.compile(bound, backend=as_is_backend(self.config))
        return torch.compile(
            bound,
            fullgraph=True,
            dynamic=False,
            backend=backend,
            options={"guard_filter_fn": _guard_filter(backend.warm_start)},
        )

    def _mark_dynamic(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Mark the dynamic dimensions unbacked: Dynamo and Inductor then reason about
        them without the first call's value, so a trace made from a first call of size
        0, 1 or 2 is as general as one made from any other size. ``strict`` turns a
        model that forces a specialisation into an error instead of a one-size graph."""
        from torch._dynamo.decorators import mark_unbacked

        bound = self.signature.bind(self.module, *args, **kwargs)
        for name, dims in self.dynamic_arg_dims.items():
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor):
                for dim in [dims] if isinstance(dims, int) else dims:
                    mark_unbacked(value, dim % value.dim())
                    mark_unbacked(value, dim % value.dim(), strict=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is not None:
            return self.compiled(*args, **kwargs)
        with compile_lock:
            if self.compiled is not None:  # another thread compiled it meanwhile
                return self.compiled(*args, **kwargs)
            return self._first_call(args, kwargs)

    def _first_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        counters.bump("num_models_seen")
        backend = None
        if self.config.level >= CompilationLevel.DYNAMO_ONCE:
            if self.config.cache_enabled:
                # Before Dynamo is imported: that fixes Inductor's folder for the process.
                place_inductor_cache(self.config.resolved_cache_dir)
            backend = self._backend()
            if backend.warm_start is not None:
                loaded = backend.warm_start.load(args, kwargs, backend.build)
                if loaded is not None:
                    result = loaded(*args, **kwargs)
                    self.compiled = loaded
                    return result
                backend = self._backend()  # untouched by a load that failed half-way
        compiled = self._compile(backend)
        if backend is not None:
            args, kwargs = arguments_to_trace(args, kwargs)
            self._mark_dynamic(args, kwargs)
        # Kept only once a call through it succeeded: a first call that fails (bad input,
        # an empty batch) leaves nothing half-compiled behind, and the next call traces.
        try:
            result = compiled(*args, **kwargs)
        except torch._dynamo.exc.UserError as err:
            if not _depends_on_dynamic_size(err):
                raise
            raise SizeSpecializationError(
                f"{type(self.module).__qualname__}.forward takes a different path depending "
                f"on the size of a dynamic dimension ({self.dynamic_arg_dims}), so one trace "
                "cannot serve every size: remove the branch on that size (torch._check "
                "can state what is always true), leave the argument out of "
                "dynamic_arg_dims, or compile at level 1, which re-traces per size. "
                f"Dynamo: {_user_location(err)}"
            ) from err
        except torch._dynamo.exc.BackendCompilerFailed as err:
            # slotwise's own error from inside the backend (a full disk, a refused
            # config) already names the problem and the fix: shown as it is, one line.
            if isinstance(err.inner_exception, SlotwiseError):
                raise err.inner_exception from None
            raise
        self.compiled = compiled if backend is None else self._entry(backend, compiled, result)
        return result

    def _entry(
        self, backend: TraceOnceBackend, compiled: Callable[..., Any], result: Any
    ) -> Callable[..., Any]:
        """What later calls run, after the first call traced through ``compiled``
        (torch.compile's function) and returned ``result``: the direct entry, or
        ``compiled`` itself when the trace's inputs or output need Dynamo's bytecode."""
        from slotwise.compilation.direct_entry import DirectEntry, output_kind
        from slotwise.compilation.trace_paths import Unpersistable

        graph_outputs = backend.take_first_outputs()
        if backend.warm_start is not None:
            backend.warm_start.save(result, graph_outputs)
        try:
            if backend.graph_inputs is None or backend.compiled is None:
                raise Unpersistable(backend.no_direct_entry or "Dynamo compiled no graph")
            if backend.graphs_compiled != 1 or graph_outputs is None:
                raise Unpersistable(f"Dynamo made {backend.graphs_compiled} graphs")
            paths, traced = backend.graph_inputs
            return DirectEntry(
                self.module,
                self.signature,
                backend.compiled,
                paths,
                traced,
                output_kind(result, graph_outputs),
                self.forward.__globals__,
            )
        except Unpersistable as err:
            logger.warning(
                "%s is called through torch.compile's entry (Dynamo's frame evaluation on "
                "every call), not slotwise's direct entry: %s",
                type(self.module).__qualname__,
                err,
            )
            return compiled


class SizeSpecializationError(SlotwiseError, RuntimeError):
    """A model whose trace would hold for one size only; slotwise refuses to keep it."""


def _depends_on_dynamic_size(err: BaseException) -> bool:
    """Whether Dynamo failed because the code branched on an unbacked (dynamic) size."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    causes = (err.__cause__, err.__context__)
    return any(isinstance(cause, GuardOnDataDependentSymNode) for cause in causes)


def _user_location(err: BaseException) -> str:
    """The failing expression and the model source line Dynamo names, on one line."""
    lines = str(err).splitlines()
    found = [i for i, line in enumerate(lines) if line.strip().startswith('File "')]
    where = " ".join(lines[found[-1] : found[-1] + 2]).split() if found else []
    return f"{lines[0] if lines else type(err).__name__} at {' '.join(where)}"
