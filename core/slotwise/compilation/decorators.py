"""Marking models for compilation: ``@support_torch_compile`` and ``@ignore_torch_compile``
on model classes, and ``slotwise.compile(module, config)``, their functional form."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from slotwise.compilation.compiled_forward import CompiledForward
from slotwise.compilation.compiled_modules import attach_compiled_forward, compiled_forward_of
from slotwise.compilation.config import CompilationConfig, CompilationLevel
from slotwise.compilation.context import get_current_compilation_config, set_compilation_config
from slotwise.compilation.static_graphs.graph_modes import check_graph_mode_level

ModuleClass = TypeVar("ModuleClass", bound=type)
DynamicArgDims = dict[str, int | list[int]]

_SPEC = "_slotwise_compile_spec"
_IGNORED = "_slotwise_compile_ignored"


def infer_dynamic_arg_dims(forward: Callable[..., Any]) -> DynamicArgDims:
    """Dim 0 of every argument annotated as a Tensor (or an optional Tensor)."""
    hints = typing.get_type_hints(forward)
    dims: DynamicArgDims = {}
    for name in inspect.signature(forward).parameters:
        hint = hints.get(name)
        if hint is torch.Tensor or torch.Tensor in typing.get_args(hint):
            dims[name] = 0
    return dims


def check_dynamic_arg_dims(
    cls: type, forward: Callable[..., Any], dims: DynamicArgDims | None
) -> DynamicArgDims:
    parameters = inspect.signature(forward).parameters
    if dims is None:
        dims = infer_dynamic_arg_dims(forward)
        if not dims:
            raise ValueError(
                f"{cls.__qualname__}.forward has no argument annotated as torch.Tensor, so "
                "slotwise cannot tell which dimensions are dynamic; annotate them or pass "
                "dynamic_arg_dims={'input_ids': 0, ...}"
            )
        return dims
    unknown = [name for name in dims if name not in parameters or name == "self"]
    if unknown:
        raise ValueError(
            f"dynamic_arg_dims names {unknown}, which are not arguments of "
            f"{cls.__qualname__}.forward; its arguments are "
            f"{[name for name in parameters if name != 'self']}"
        )
    return dict(dims)


def support_torch_compile(
    cls: ModuleClass | None = None,
    *,
    dynamic_arg_dims: DynamicArgDims | None = None,
    enable_if: Callable[[CompilationConfig], bool] | None = None,
) -> Any:
    """Compile instances of an ``nn.Module`` class according to their CompilationConfig.

    The decorated ``__init__`` accepts a keyword-only ``compilation_config=`` (default:
    the one of ``set_compilation_config``, else the environment's).  A decorated module
    called while an outer model is being compiled is inlined into the outer graph;
    called on its own, it compiles itself.  ``enable_if(config)`` returning False
    leaves the class uncompiled.
    """

    def decorate(cls: ModuleClass) -> ModuleClass:
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise TypeError(f"@support_torch_compile decorates nn.Module classes, not {cls!r}")
        original_init = cls.__init__
        original_forward = cls.forward
        dims = check_dynamic_arg_dims(cls, original_forward, dynamic_arg_dims)
        init_takes_config = "compilation_config" in inspect.signature(original_init).parameters

        @functools.wraps(original_init)
        def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            given = kwargs.get("compilation_config")
            if not init_takes_config:
                kwargs.pop("compilation_config", None)
            config = (
                get_current_compilation_config()
                if given is None
                else CompilationConfig.coerce(given)
            )
            # Decorated modules built inside this one share its config.
            with set_compilation_config(config):
                original_init(self, *args, **kwargs)
            if _nearest_spec_owner(type(self)) is not cls:
                return  # a decorated subclass compiles the instance instead
            check_graph_mode_level(config)  # level 0 compiles nothing that would refuse it
            enabled = (
                config.level > CompilationLevel.NO_COMPILATION
                and not getattr(type(self), _IGNORED, False)
                and (enable_if is None or enable_if(config))
            )
            compiled = CompiledForward(self, original_forward, config, dims) if enabled else None
            attach_compiled_forward(self, compiled)

        @functools.wraps(original_forward)
        def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            compiled = compiled_forward_of(self)
            if compiled is None or torch.compiler.is_compiling():
                return original_forward(self, *args, **kwargs)
            return compiled(*args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]
        cls.forward = forward  # type: ignore[attr-defined]
        setattr(cls, _SPEC, dims)
        setattr(cls, _IGNORED, False)
        return cls

    return decorate if cls is None else decorate(cls)


def ignore_torch_compile(cls: ModuleClass) -> ModuleClass:
    """Keep a subclass of a ``@support_torch_compile`` class uncompiled."""
    setattr(cls, _IGNORED, True)
    return cls


def _nearest_spec_owner(cls: type) -> type | None:
    return next((klass for klass in cls.__mro__ if _SPEC in klass.__dict__), None)


Module = TypeVar("Module", bound=torch.nn.Module)


def compile(
    module: Module, config: Any = None, *, dynamic_arg_dims: DynamicArgDims | None = None
) -> Module:
    """Compile ``module`` in place (its instance ``forward`` is replaced) and return it.

    ``config`` is anything ``CompilationConfig.coerce`` accepts; None takes the one of
    ``set_compilation_config`` or the environment.  Dynamic dimensions default to dim 0
    of the Tensor-annotated arguments of ``forward``.
    """
    config = (
        get_current_compilation_config() if config is None else CompilationConfig.coerce(config)
    )
    check_graph_mode_level(config)
    if config.level == CompilationLevel.NO_COMPILATION:
        return module
    forward = type(module).forward
    dims = check_dynamic_arg_dims(type(module), forward, dynamic_arg_dims)
    compiled = CompiledForward(module, forward, config, dims)
    module.forward = compiled  # type: ignore[method-assign]
    attach_compiled_forward(module, compiled)
    return module
