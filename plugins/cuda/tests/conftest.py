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

from slotwise.testing.triton_interpreter import ON_GPU, helpers_interpreted, import_interpreted

KERNEL_MODULES = [
    f"slotwise_cuda.kernels.{name}" for name in ("attention", "activation", "layernorm", "rotary")
]

if not ON_GPU:
    pytest.importorskip("numpy", reason="Triton's interpreter (no GPU here) needs numpy")
    import_interpreted(*KERNEL_MODULES)


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    if ON_GPU:
        return
    if not helpers_interpreted():
        pytest.fail(
            "triton.language was imported without TRITON_INTERPRET=1 before this folder's "
            "conftest.py (by a module imported earlier); run with TRITON_INTERPRET=1 exported"
        )
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    """Where the kernels run: the GPU, or the CPU through the interpreter."""
    return "cuda" if ON_GPU else "cpu"
