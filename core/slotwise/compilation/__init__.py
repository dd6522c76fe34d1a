"""Piecewise torch.compile, grouped by concept.

At the top: the settings (``config``, ``context``), marking models for compilation
(``decorators``) and what a marked model runs (``compiled_forward``, ``compilers``,
``compile_lock``, ``platform_defaults``, ``compile_counters``). Below, one subpackage
each: ``splitting`` (Dynamo graph to pieces and the piecewise backends),
``static_graphs`` (GraphAPI, the static-graph contract and wrapper, graph modes),
``cache`` (the compile cache and its keys) and ``warm_start`` (starting without Dynamo).

Names are loaded on first access: ``slotwise.compilation.config`` is used before
torch is imported, and importing this package must not pull torch in.
"""

from __future__ import annotations

from slotwise.lazy_exports import lazy_exports

_EXPORTS = {
    "CompilationConfig": ".config",
    "CompilationLevel": ".config",
    "ConfigError": ".config",
    "GraphMode": ".config",
    "counters": ".compile_counters",
    "set_compilation_config": ".context",
    "get_current_compilation_config": ".context",
    "support_torch_compile": ".decorators",
    "ignore_torch_compile": ".decorators",
    "compile": ".decorators",
    "compiled_forward_of": ".compiled_modules",
    "AbstractPiecewiseBackend": ".splitting.piecewise_backend",
    "CompiledPiecewiseBackend": ".splitting.piecewise_backend",
    "StaticGraphError": ".static_graphs.contract",
    "SizeSpecializationError": ".compiled_forward",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
