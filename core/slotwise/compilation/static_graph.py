"""The static-graph contract shared by every graph platform (CUDA graphs, NPU graphs).

A captured graph replays fixed kernels on fixed addresses, so:
- replays read inputs from the addresses seen at capture; a moved input is detected
  on the first replay of each size (every replay with ``debug_checks``) and raises
  ``StaticGraphError``;
- capture happens only after warm-up runs, and, once a runner has captured the
  sizes it serves (the capture window), never again at run time;
- which graph acts in a step (none, the pieces', or the full model's) follows one
  rule, ``graph_modes.step_graph_mode``, so nested wrappers never both capture.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from slotwise.errors import SlotwiseError


class StaticGraphError(SlotwiseError, RuntimeError):
    """A static graph was used against its contract, e.g. an input moved after capture."""


class _CaptureWindow:
    """Process-wide state: is capturing allowed right now?

    ``None``: no runner has taken charge, captures happen lazily on first use (tests,
    simple scripts).  ``True``: a runner is capturing.  ``False``: the runner is done;
    a capture now would stall a serving step, and means a size was missed.
    """

    def __init__(self) -> None:
        self.state: bool | None = None
        self.lock = threading.Lock()


_window = _CaptureWindow()


@contextlib.contextmanager
def capture_window() -> Iterator[None]:
    """Open the window in which graphs may be captured; after it, captures are errors."""
    with _window.lock:
        _window.state = True
    try:
        yield
    finally:
        with _window.lock:
            _window.state = False


def reset_capture_window() -> None:
    """Back to lazy captures (a runner that is torn down, or a test)."""
    with _window.lock:
        _window.state = None


def check_capture_allowed(what: str, size: int) -> None:
    if _window.state is False:
        raise StaticGraphError(
            f"{what} would capture a static graph for size {size} after the capture window "
            "closed: the runner captured its sizes at start-up and this one was not among "
            f"them; add {size} to capture_sizes, or pad batches to a captured size"
        )


def input_addresses(args: Sequence[Any]) -> list[int | None]:
    """The data address of every tensor argument (None for other arguments)."""
    import torch

    return [arg.data_ptr() if isinstance(arg, torch.Tensor) else None for arg in args]


def check_input_addresses(
    what: str, size: int, captured: Sequence[int | None], args: Sequence[Any]
) -> None:
    """Raise ``StaticGraphError`` naming the first tensor argument that moved."""
    for index, (expected, actual) in enumerate(zip(captured, input_addresses(args), strict=True)):
        if expected != actual:
            raise StaticGraphError(
                f"{what}, capture size {size}: argument {index} was captured at address "
                f"{_address(expected)} but is now at {_address(actual)}; a replay reads the "
                "captured address, so copy new inputs into the captured buffers "
                "(slotwise.runner does this) instead of passing new tensors, or set "
                "graph_copy_inputs=True in the compilation config to have slotwise copy them"
            )


def _address(value: int | None) -> str:
    return "(not a tensor)" if value is None else f"{value:#x}"
