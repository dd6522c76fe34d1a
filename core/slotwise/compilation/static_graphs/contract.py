"""The static-graph contract shared by every graph platform (CUDA graphs, NPU graphs).

A captured graph replays fixed kernels on fixed addresses, so a moved input and a
replay that does not write the captured outputs raise ``StaticGraphError`` (checked on
the first replay of each size, every replay with ``debug_checks``); capture comes after
warm-ups and never after the runner's capture window; one ``GraphDispatcher`` decides
which graph acts in a step.
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
    """Process-wide state: is capturing allowed right now?  ``None``: no runner has taken
    charge (lazy captures); ``True``: a runner is capturing; ``False``: it is done."""

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


def graph_inputs(args: Sequence[Any]) -> list[Any]:
    """The values a graph reads, in order: the arguments, with lists and tuples opened
    (an Inductor partition takes its inputs as one list, which it empties as it runs)."""
    inputs: list[Any] = []
    for arg in args:
        if isinstance(arg, (list, tuple)):
            inputs.extend(arg)
        else:
            inputs.append(arg)
    return inputs


def input_addresses(args: Sequence[Any]) -> list[int | None]:
    """The data address of every tensor in ``graph_inputs(args)`` (None for other values)."""
    import torch

    return [
        value.data_ptr() if isinstance(value, torch.Tensor) else None
        for value in graph_inputs(args)
    ]


def check_input_addresses(
    what: str, size: int, captured: Sequence[int | None], args: Sequence[Any]
) -> None:
    """Raise ``StaticGraphError`` naming the first tensor input that moved."""
    for index, (expected, actual) in enumerate(zip(captured, input_addresses(args), strict=True)):
        if expected != actual:
            raise StaticGraphError(
                f"{what}, capture size {size}: input {index} was captured at address "
                f"{_address(expected)} but is now at {_address(actual)}; a replay reads the "
                "captured address, so copy new inputs into the captured buffers "
                "(slotwise_engine.runner does this) instead of passing new tensors, or set "
                "graph_copy_inputs=True in the compilation config to have slotwise copy them; "
                "an input a splitting op returns moves at every step: have that op write "
                "into a tensor allocated before it (its out variant, as "
                "torch.ops.slotwise.tp_all_reduce.out) or drop it from splitting_ops; a "
                "parameter or buffer replaced after capture moves too: copy new weights into "
                "the captured ones (param.data.copy_(new), load_state_dict without "
                "assign=True) or build and capture the model again"
            )


#: What ``OutputsProbe`` writes: a value no computation gives by chance, so an output
#: still holding it everywhere after a replay was not written by that replay.
_MARKER = -1.2345e-5
_MARKABLE = ("float16", "bfloat16", "float32", "float64")


class OutputsProbe:
    """Finds out whether a replay wrote into the captured outputs, by filling them with a
    marker before it and restoring any that still hold only the marker after it."""

    def __init__(self, outputs: Any, args: Sequence[Any]) -> None:
        import torch
        from torch.utils import _pytree as pytree

        # An output in an input's memory (an Inductor partition may write its result
        # over an input it was handed) must keep its value: the replay reads it.
        read = {
            value.untyped_storage().data_ptr()
            for value in graph_inputs(args)
            if isinstance(value, torch.Tensor)
        }
        self.saved = [
            (out, out.clone())
            for out in pytree.tree_leaves(outputs)
            if isinstance(out, torch.Tensor)
            and str(out.dtype).removeprefix("torch.") in _MARKABLE
            and out.numel() > 0
            and out.untyped_storage().data_ptr() not in read
        ]
        for out, _ in self.saved:
            out.fill_(_MARKER)

    def nothing_written(self) -> bool:
        """After the replay: whether it left every marked output alone (restoring them)."""
        untouched = [(out, value) for out, value in self.saved if bool((out == _MARKER).all())]
        for out, value in untouched:
            out.copy_(value)
        return bool(self.saved) and len(untouched) == len(self.saved)


def check_outputs_written(
    what: str, size: int, graph_api: Any, probe: OutputsProbe, returned: Any
) -> None:
    """Raise ``StaticGraphError`` if a replay returned a value (``returned``) or wrote none
    of the captured outputs (``probe``): either way its results went somewhere other than
    the tensors ``capture()`` returned, which are what slotwise hands on."""
    nothing_written = probe.nothing_written()
    if returned is None and not nothing_written:
        return
    found = (
        f"it returned a {type(returned).__name__} instead of None"
        if returned is not None
        else "every captured output still holds what slotwise wrote there before the replay"
    )
    raise StaticGraphError(
        f"{what}, capture size {size}: replay() of {type(graph_api).__name__} did not write "
        f"into the tensors capture() returned ({found}); a replay must write its results "
        "in place into the captured outputs, not into new tensors"
    )


def _address(value: int | None) -> str:
    return "(not a tensor)" if value is None else f"{value:#x}"
