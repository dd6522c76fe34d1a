"""Piecewise torch.compile: configuration, decorators, splitting and piecewise backends.

Names are loaded on first access: ``slotwise.compilation.config`` is used before
torch is imported, and importing this package must not pull torch in.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CompilationConfig": "config",
    "CompilationLevel": "config",
    "ConfigError": "config",
    "GraphMode": "config",
    "counters": "compile_counters",
    "set_compilation_config": "context",
    "get_current_compilation_config": "context",
    "support_torch_compile": "decorators",
    "ignore_torch_compile": "decorators",
    "compile": "decorators",
    "compiled_forward_of": "decorators",
    "AbstractPiecewiseBackend": "piecewise_backend",
    "CompiledPiecewiseBackend": "piecewise_backend",
    "StaticGraphError": "static_graph",
    "SizeSpecializationError": "compiled_forward",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'slotwise.compilation' has no attribute {name!r}")
    return getattr(importlib.import_module(f"slotwise.compilation.{module}"), name)
