"""Kernel tests run compiled on a GPU when there is one, else in Triton's interpreter.

The interpreter is chosen when ``@triton.jit`` decorates a kernel, i.e. when a kernel
module is imported, and launches check ``TRITON_INTERPRET`` again (parts of triton that
load lazily assert it). So the modules are imported here with the variable set (again,
should another folder have imported them first) and each test of this folder runs with
it set; the rest of the session and its subprocesses keep their environment. The
interpreter runs on plain CPU tensors and needs numpy.
"""

from __future__ import annotations

import pytest
from triton_support import ON_GPU, import_interpreted

KERNEL_MODULES = [
    f"slotwise_cuda.kernels.{name}" for name in ("attention", "activation", "layernorm", "rotary")
]

if not ON_GPU:
    pytest.importorskip("numpy", reason="Triton's interpreter (no GPU here) needs numpy")
    import_interpreted(*KERNEL_MODULES)


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    """Where the kernels run: the GPU, or the CPU through the interpreter."""
    return "cuda" if ON_GPU else "cpu"
