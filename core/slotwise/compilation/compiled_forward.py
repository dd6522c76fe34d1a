"""The compiled forward of one model instance, for levels 1 to 3."""

from __future__ import annotations

import hashlib
import inspect
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.fx.experimental._config as fx_config

from slotwise.compilation.compile_counters import counters
from slotwise.compilation.config import CompilationConfig, CompilationLevel
from slotwise.compilation.dynamo_backends import GraphCompiler, as_is_backend
from slotwise.platforms import Platform, get_current_platform

logger = logging.getLogger("slotwise")


def drop_all_guards(guards: list[Any]) -> list[bool]:
    """Keep no Dynamo guard: the one trace serves every later call (levels 2 and 3)."""
    return [False] * len(guards)


def prepare_config(config: CompilationConfig, platform: Platform) -> CompilationConfig:
    """A copy of ``config`` adapted by the platform, with every change logged.

    The diff is logged here rather than trusted to each platform, so a plugin that
    forgets to log cannot change a setting silently.
    """
    adapted = config.replace()
    before = adapted.to_dict()
    platform.check_and_update_config(adapted)
    after = adapted.to_dict()
    for key, value in after.items():
        if before[key] != value:
            logger.info(
                "platform %s set compilation %s: %r -> %r", platform.name, key, before[key], value
            )
    return adapted


def model_source_hash(module: torch.nn.Module) -> str:
    """Hash of the source of every model class in ``module`` (torch's own excluded),
    so an edited model never loads artifacts compiled from the old code."""
    digest = hashlib.sha256()
    seen: set[type] = set()
    for submodule in module.modules():
        for cls in type(submodule).__mro__:
            if cls in seen or cls.__module__.split(".")[0] in ("torch", "builtins"):
                continue
            seen.add(cls)
            try:
                source = inspect.getsource(cls)
            except (OSError, TypeError):
                source = cls.__qualname__  # defined interactively: no source to hash
            digest.update(f"{cls.__module__}.{cls.__qualname__}\n{source}".encode())
    return digest.hexdigest()


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
        self.config = prepare_config(config, self.platform)
        self.dynamic_arg_dims = dynamic_arg_dims
        self.signature = inspect.signature(forward)
        self.compiled: Callable[..., Any] | None = None

    def _compile(self) -> Callable[..., Any]:
        counters.bump("num_models_seen")
        bound = types.MethodType(_fresh_function(self.forward), self.module)
        if self.config.level == CompilationLevel.DYNAMO_AS_IS:
            return torch.compile(bound, backend=as_is_backend(self.config))
        cls = type(self.module)
        backend = GraphCompiler(
            self.config,
            self.platform,
            cache_factors={
                "model": f"{cls.__module__}.{cls.__qualname__}",
                "model_source": model_source_hash(self.module),
                "platform": self.platform.name,
            },
            piecewise=self.config.level == CompilationLevel.PIECEWISE,
        )
        return torch.compile(
            bound,
            fullgraph=True,
            dynamic=False,
            backend=backend,
            options={"guard_filter_fn": drop_all_guards},
        )

    def _mark_dynamic(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        bound = self.signature.bind(self.module, *args, **kwargs)
        for name, dims in self.dynamic_arg_dims.items():
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor):
                for dim in [dims] if isinstance(dims, int) else dims:
                    torch._dynamo.mark_dynamic(value, dim % value.dim())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is not None:
            return self.compiled(*args, **kwargs)
        self.compiled = self._compile()
        if self.config.level < CompilationLevel.DYNAMO_ONCE:
            return self.compiled(*args, **kwargs)
        self._mark_dynamic(args, kwargs)
        # The one trace must stay general even when the first call has size 0 or 1,
        # which Dynamo would otherwise specialise on (and, with guards dropped, keep).
        with fx_config.patch(backed_size_oblivious=True):
            return self.compiled(*args, **kwargs)
