"""Where a compiled module keeps its compilation: one entry of its ``__dict__``, which the
runner's dispatcher and recorded steps read to reach the model's compiled forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from slotwise.compilation.compiled_forward import CompiledForward

_COMPILED = "_slotwise_compiled_forward"


def attach_compiled_forward(module: torch.nn.Module, compiled: CompiledForward) -> None:
    """Record ``compiled`` as the compilation of ``module``."""
    module.__dict__[_COMPILED] = compiled


def compiled_forward_of(module: torch.nn.Module) -> CompiledForward | None:
    """The compilation of ``module`` itself, made by ``@support_torch_compile`` or
    ``slotwise.compile()``; None when the module is not compiled (level 0, disabled,
    ignored, or never marked). Submodules are not searched."""
    return module.__dict__.get(_COMPILED)
