"""Runs a plugin's Triton kernels on the CPU, in Triton's interpreter, when there is no GPU.

So a plugin's Triton kernels are tested in a CI without a GPU (the CUDA plugin's are).
Triton decides whether a ``@triton.jit`` function is interpreted when it is
decorated, and its own helpers (``tl.max``, ``tl.cdiv``, ...) are decorated when
``triton.language`` is first imported, which ``torch._dynamo`` does.  So a test
module (or conftest.py) imports this before anything that pulls triton in: it imports
``triton.language`` under ``TRITON_INTERPRET=1`` and restores the environment, then
imports its kernel modules with ``import_interpreted``.  Launches check the variable
again, so tests set it while they run kernels.  The interpreter needs numpy.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import torch

ON_GPU = torch.cuda.is_available()


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` inside the block, the previous environment after it."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def helpers_interpreted() -> bool:
    """Whether ``triton.language``'s own jitted helpers run in the interpreter."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.cdiv, InterpretedFunction)


def import_interpreted(*names: str) -> list[ModuleType]:
    """Import (or re-import) the kernel modules ``names`` so their kernels are interpreted."""
    modules = []
    with interpreting():
        for name in names:
            if name in sys.modules:
                modules.append(importlib.reload(sys.modules[name]))
            else:
                modules.append(importlib.import_module(name))
    return modules


if not ON_GPU and "triton" not in sys.modules:
    with interpreting(), contextlib.suppress(ImportError):
        importlib.import_module("triton.language")
