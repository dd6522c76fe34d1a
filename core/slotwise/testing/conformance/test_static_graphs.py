"""Check ``static_graphs``: a platform declaring static graphs keeps their contract.

Only for platforms whose ``get_graph_api()`` returns a GraphAPI, in every graph mode the
platform declares for a model without attention (``supported_graph_modes``).  With
capture sizes [1, 2] each size runs once plainly (warm-up), is captured on its second
call and replayed after that: as SillyModel's three capturable pieces in PIECEWISE, as
the whole model in FULL, and in FULL_AND_PIECEWISE as the whole model for size 1 (sent
as a uniform-decode batch) and as the pieces for size 2.
The static-graph contract (docs/design.md) is what makes replays safe: a replay reads its
inputs from the addresses captured, so new data copied into the captured buffer is seen
(host values frozen at capture must not hide it); it writes its results into the tensors
the capture returned; a new input tensor is detected on the first replay and raises
``StaticGraphError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from slotwise.compilation import CompilationConfig, GraphMode, StaticGraphError, counters
from slotwise.compilation.static_graphs.dispatcher import GraphDispatcher
from slotwise.compilation.static_graphs.graph_modes import supported_graph_modes
from slotwise.testing.conformance import target
from slotwise.testing.conformance.toy_setup import (
    HIDDEN,
    first_difference,
    inputs,
    level3_config,
    twin_models,
)

CAPTURE_SIZES = (1, 2)
CAPTURABLE_PIECES = 3
RUNS = ("warm-up", "capture", "replay")
#: In FULL_AND_PIECEWISE, batches of this size are sent as uniform decodes (full graph).
UNIFORM_DECODE_SIZE = 1
MODES = [GraphMode.PIECEWISE, GraphMode.FULL, GraphMode.FULL_AND_PIECEWISE]

by_mode = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)


def graph_config(mode: GraphMode) -> CompilationConfig:
    platform = target.platform()
    if platform.get_graph_api() is None:
        target.skip("get_graph_api() returns None, so there is no static-graph contract")
    if mode not in supported_graph_modes(platform):
        target.skip(f"graph mode {mode.name} is not among the modes the platform supports")
    return level3_config(capture_sizes=list(CAPTURE_SIZES), graph_mode=mode.name, graph_warmups=1)


def full_graph(mode: GraphMode, size: int) -> bool:
    """Whether ``size`` runs as one graph of the whole model in ``mode``."""
    return mode == GraphMode.FULL or (
        mode == GraphMode.FULL_AND_PIECEWISE and size == UNIFORM_DECODE_SIZE
    )


def graphs_of(mode: GraphMode, size: int) -> str:
    return "the full graph" if full_graph(mode, size) else "the pieces' graphs"


@contextlib.contextmanager
def step(model: torch.nn.Module, size: int) -> Iterator[None]:
    """A step of ``size`` tokens with the graphs the model's ``GraphDispatcher`` gives it,
    as a runner runs it; the uniform-decode size is sent as a uniform decode, which takes
    the full graph in FULL_AND_PIECEWISE."""
    uniform = size == UNIFORM_DECODE_SIZE
    with GraphDispatcher.for_model(model).step(size, uniform_decode=uniform):
        yield


def run(model: torch.nn.Module, buffer: torch.Tensor, mode: GraphMode, what: str) -> torch.Tensor:
    """``model(buffer)`` in a step of ``mode``; an exception fails the check, naming the run."""
    size = buffer.shape[0]
    try:
        with step(model, size):
            return model(buffer)
    except Exception as exc:  # noqa: BLE001 - reported with the run that raised it
        target.fail(
            f"{mode.name} graphs, size {size} ({graphs_of(mode, size)}), {what}: "
            f"{type(exc).__name__}: {exc}{own_backend_fix(mode)}"
        )


def own_backend_fix(mode: GraphMode) -> str:
    """How to fix a platform whose own piecewise backend skips slotwise's checks; empty
    when slotwise's backend runs the pieces (then slotwise's checks name the problem)."""
    backend = target.platform().get_piecewise_backend_cls()
    if backend is None or not mode.has_piecewise_graphs:
        return ""
    name = getattr(backend, "__name__", repr(backend))
    return (
        f". The platform runs its pieces in its own {name} (get_piecewise_backend_cls()), "
        "where slotwise's static-graph checks do not run: return None from "
        "get_piecewise_backend_cls() so that slotwise's StaticGraphPiecewiseBackend runs "
        "each piece on the platform's GraphAPI (it checks the input addresses on the first "
        f"replay of each size and replays into the captured outputs), or make {name} "
        "capture on its GraphAPI, record slotwise.plugin_api.input_addresses(args) at "
        "capture and call slotwise.plugin_api.check_input_addresses on the first replay "
        "of each size, which raises StaticGraphError"
    )


@by_mode
def test_each_size_captures_once_and_replays_match_eager(mode: GraphMode) -> None:
    model, reference = twin_models(graph_config(mode))
    expected = sum(1 if full_graph(mode, size) else CAPTURABLE_PIECES for size in CAPTURE_SIZES)
    wrong = []
    try:
        with counters.expect(num_graphs_captured=expected):
            for size in CAPTURE_SIZES:
                buffer = torch.empty(size, HIDDEN, device=target.platform().device_type)
                for index, name in enumerate(RUNS):
                    buffer.copy_(inputs(size, seed=10 * size + index))
                    difference = first_difference(
                        run(model, buffer, mode, f"{name} run"), reference(buffer)
                    )
                    if difference:
                        wrong.append(f"size {size}, {name} run: {difference}")
    except AssertionError as exc:
        target.fail(
            f"{mode.name} graphs: running capture sizes {list(CAPTURE_SIZES)} three times "
            f"each (warm-up, capture, replay) must capture {expected} graphs: {exc}"
        )
    if wrong:
        target.fail(
            f"{mode.name} graphs: the outputs differ from eager, with new data copied into "
            "the same input buffer before each run: " + "; ".join(wrong) + own_backend_fix(mode)
        )


@by_mode
def test_replay_reads_new_data_from_the_captured_buffer(mode: GraphMode) -> None:
    model, reference = twin_models(graph_config(mode))
    for size in CAPTURE_SIZES:
        buffer = inputs(size, seed=size)
        run(model, buffer, mode, "warm-up run")
        run(model, buffer, mode, "capture run")
        buffer.zero_()
        with counters.expect(num_graphs_captured=0):
            out = run(model, buffer, mode, "replay")
        difference = first_difference(out, reference(torch.zeros_like(buffer)))
        if difference:
            target.fail(
                f"{mode.name} graphs, size {size} ({graphs_of(mode, size)}): after zeroing "
                f"the captured input buffer, the replay does not give the eager result for "
                f"zeros: {difference}; a replay must read its inputs from the captured "
                f"addresses{own_backend_fix(mode)}"
            )


@by_mode
def test_replays_see_new_data_copied_after_capture_and_write_one_output(mode: GraphMode) -> None:
    model, reference = twin_models(graph_config(mode))
    for size in CAPTURE_SIZES:
        buffer = inputs(size, seed=100 + size)
        run(model, buffer, mode, "warm-up run")
        run(model, buffer, mode, "capture run")
        addresses = set()
        for replay in range(3):
            buffer.copy_(inputs(size, seed=200 + 10 * size + replay))
            out = run(model, buffer, mode, f"replay {replay + 1} after capture")
            addresses.add(out.data_ptr())
            difference = first_difference(out, reference(buffer))
            if difference:
                target.fail(
                    f"{mode.name} graphs, size {size} ({graphs_of(mode, size)}): replay "
                    f"{replay + 1} after capture, with new data copied into the captured "
                    f"input buffer, differs from eager: {difference}; a replay must compute "
                    "from the data in the captured buffers now, not from values the capture "
                    f"saw{own_backend_fix(mode)}"
                )
        if len(addresses) > 1:
            target.fail(
                f"{mode.name} graphs, size {size} ({graphs_of(mode, size)}): three replays "
                f"returned outputs at {len(addresses)} different addresses; a replay must "
                "write its results in place into the tensors its capture returned"
                f"{own_backend_fix(mode)}"
            )


@by_mode
def test_a_fresh_input_tensor_at_a_captured_size_raises(mode: GraphMode) -> None:
    model, _ = twin_models(graph_config(mode))
    for size in CAPTURE_SIZES:
        buffer = inputs(size, seed=2)
        run(model, buffer, mode, "warm-up run")
        run(model, buffer, mode, "capture run")
        fresh = torch.empty(size, HIDDEN, device=buffer.device).copy_(buffer)
        try:
            with step(model, size):
                model(fresh)
        except StaticGraphError:
            continue
        target.fail(
            f"{mode.name} graphs, size {size} ({graphs_of(mode, size)}): replaying with a new "
            "input tensor (another address) did not raise "
            "slotwise.compilation.StaticGraphError; the static-graph contract requires the "
            f"input addresses to be checked on the first replay of each size{own_backend_fix(mode)}"
        )
