"""A process-wide count of parameter, buffer and submodule registrations.

Why: a compiled model binds its weights once and a captured graph reads the addresses it
was captured with, so a weight replaced afterwards (``module.weight = Parameter(...)``,
``load_state_dict(assign=True)``) must be noticed, yet looking at the model on every step
costs what the direct entry and the graphs exist to save.  Every such replacement goes
through torch's registration hooks; they move one counter, and what bound or captured
weights compares it with the value it saw, one integer per call.
"""

from __future__ import annotations

from typing import Any

import torch

_count = 0
_watching = False


def count() -> int:
    """The number of registrations seen since ``watch`` was first called."""
    return _count


def watch() -> None:
    """Count registrations from now on (hooks installed once per process)."""
    global _watching
    if _watching:
        return
    from torch.nn.modules import module as nn_module

    nn_module.register_module_parameter_registration_hook(_counted)
    nn_module.register_module_buffer_registration_hook(_counted)
    nn_module.register_module_module_registration_hook(_counted)
    _watching = True


def _counted(module: torch.nn.Module, name: str, value: Any) -> None:
    global _count
    _count += 1
