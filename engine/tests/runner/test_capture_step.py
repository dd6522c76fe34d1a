"""slotwise_engine.runner's capture step with the CPU graph API."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, GraphMode, counters
from slotwise.compilation.static_graphs.contract import StaticGraphError, reset_capture_window
from slotwise.compilation.static_graphs.dispatcher import CaptureCase, GraphDispatcher
from slotwise.platforms import get_current_platform
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel
from slotwise_engine.runner.capture import capture_graphs


@pytest.fixture
def captured(graph_api):
    config = CompilationConfig(
        level=3,
        backend="eager",
        splitting_ops=TOY_SPLITTING_OPS,
        capture_sizes=[1, 2, 4],
        graph_mode="PIECEWISE",
    )
    torch.manual_seed(0)
    model = SillyModel(compilation_config=config)
    dispatcher = GraphDispatcher.for_model(model)
    x = torch.zeros(4, 8)  # the static input: every size reads a view of it
    sizes_seen = []

    def run_case(case: CaptureCase) -> None:
        sizes_seen.append(case.size)
        with dispatcher.step(case.size, uniform_decode=case.uniform_decode):
            model(x[: case.size])

    plan = [CaptureCase(size, GraphMode.PIECEWISE, False) for size in (1, 4, 2)]
    with counters.expect(num_graphs_captured=9):
        reports = capture_graphs(
            run_case, plan, get_current_platform(), runs_per_size=2, progress=False
        )
    yield model, dispatcher, x, reports, sizes_seen
    reset_capture_window()


def test_every_size_is_captured_largest_first_with_a_report(captured):
    _, _, _, reports, sizes_seen = captured
    assert [report.size for report in reports] == [4, 2, 1]
    assert sizes_seen == [4, 4, 2, 2, 1, 1]
    assert all(report.seconds > 0 for report in reports)
    assert all(report.graphs == 3 for report in reports)


def test_every_case_of_a_size_runs_in_each_round(graph_api):
    seen = []
    plan = [
        CaptureCase(size, mode, uniform)
        for size in (1, 2)
        for mode, uniform in ((GraphMode.FULL, True), (GraphMode.PIECEWISE, False))
    ]
    capture_graphs(seen.append, plan, get_current_platform(), runs_per_size=2, progress=False)
    reset_capture_window()
    assert [(case.size, case.uniform_decode) for case in seen] == [
        (2, True),
        (2, False),
        (2, True),
        (2, False),
        (1, True),
        (1, False),
        (1, True),
        (1, False),
    ]


def test_callers_tensors_of_any_address_go_through_the_static_buffers(captured):
    model, dispatcher, static_x, _, _ = captured
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0))
    with counters.expect(num_graphs_captured=0):
        for size in (3, 2, 1):
            x = torch.randn(size, 8)
            with dispatcher.step(size) as graphs:
                static_x[:size].copy_(x)
                static_x[size:].zero_()
                out = model(static_x[: graphs.padded_size])[:size]
            torch.testing.assert_close(out, reference(x))


def test_after_the_capture_step_only_uncaptured_sizes_run_without_error(captured):
    model, dispatcher, _, _, _ = captured
    with counters.expect(num_graphs_captured=0):
        for _ in range(3):
            with dispatcher.step(5):  # above every capture size: runs without graphs
                model(torch.randn(5, 8))


def test_a_capture_size_the_step_missed_is_an_error_after_the_window(graph_api):
    config = CompilationConfig(
        level=3, backend="eager", splitting_ops=TOY_SPLITTING_OPS, capture_sizes=[1, 2]
    )
    model = SillyModel(compilation_config=config)
    dispatcher = GraphDispatcher.for_model(model)
    buffer = torch.zeros(2, 8)

    def run(size: int) -> None:
        with dispatcher.step(size):
            model(buffer[:size])

    try:
        capture_graphs(
            lambda case: run(case.size),
            [CaptureCase(2, GraphMode.PIECEWISE, False)],
            get_current_platform(),
            runs_per_size=2,
            progress=False,
        )
        run(1)  # warm-up
        with pytest.raises(StaticGraphError, match="size 1 after the capture window closed"):
            run(1)
    finally:
        reset_capture_window()
