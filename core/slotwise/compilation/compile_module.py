"""``slotwise.compile(module, config)``: the functional form of ``@support_torch_compile``."""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from slotwise.compilation.compiled_forward import CompiledForward
from slotwise.compilation.config import CompilationConfig, CompilationLevel
from slotwise.compilation.context import get_current_compilation_config
from slotwise.compilation.decorators import DynamicArgDims, check_dynamic_arg_dims

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
    if config.level == CompilationLevel.NO_COMPILATION:
        return module
    forward = type(module).forward
    dims = check_dynamic_arg_dims(type(module), forward, dynamic_arg_dims)
    module.forward = CompiledForward(module, forward, config, dims)  # type: ignore[method-assign]
    return module
