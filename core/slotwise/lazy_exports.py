"""Names a package exports but imports only on first access.

Why: ``import slotwise`` and the plugin API must stay cheap (no torch, no device), yet
offer names whose modules import torch. A package lists each public name with the
module defining it and takes the module-level ``__getattr__`` and ``__dir__`` made here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], *, unknown: str | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, which exports each name of
    ``exports`` from the module it maps to (absolute, or relative to ``package`` when
    it starts with a dot).

    A loaded name is stored in the package, so later lookups skip ``__getattr__``.
    ``unknown`` is the error for any other name, with ``{name}`` filled in (quoted).
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            message = unknown or f"module {package!r} has no attribute {{name}}"
            raise AttributeError(message.format(name=repr(name)))
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        # What the package defines, and the names not loaded yet (tab completion).
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
