"""slotwise's static-graph bookkeeping, run on the CPU with the core's recorded graphs."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.static_graphs.contract import (
    StaticGraphError,
    capture_window,
    reset_capture_window,
)
from slotwise.compilation.static_graphs.dispatcher import GraphDispatcher
from slotwise.forward_context import BatchDescriptor, get_forward_context, set_forward_context
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel


def graph_config(**changes) -> CompilationConfig:
    fields = {
        "level": 3,
        "backend": "eager",
        "splitting_ops": TOY_SPLITTING_OPS,
        "capture_sizes": [1, 2],
        "graph_mode": "PIECEWISE",
    }
    fields.update(changes)
    return CompilationConfig(**fields)


def models(config):
    torch.manual_seed(0)
    model = SillyModel(compilation_config=config)
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0))
    return model, reference


def run(model, x, *, uniform_decode=False):
    """``model(x)`` in a step as the model's ``GraphDispatcher`` describes it to a runner."""
    with GraphDispatcher.for_model(model).step(x.shape[0], uniform_decode=uniform_decode):
        return model(x)


def test_two_sizes_run_three_times_capture_six_graphs_and_match_eager(graph_api):
    model, reference = models(graph_config())
    with counters.expect(num_graphs_captured=6, num_piecewise_capturable_graphs_seen=3):
        for size in (1, 2):
            buffer = torch.empty(size, 8)
            for _ in range(3):  # warm-up, capture, replay
                buffer.copy_(torch.randn(size, 8))
                torch.testing.assert_close(run(model, buffer), reference(buffer))
    assert len(graph_api.captures) == 6
    assert len({id(capture["pool"]) for capture in graph_api.captures}) == 1
    # Per size: the first piece captures with clean-up, the two after it quietly.
    assert [capture["quiet"] for capture in graph_api.captures] == [False, True, True] * 2
    assert graph_api.weak_refs == 2  # the last piece's outputs, once per size


def test_replay_reads_new_data_from_the_captured_buffer(graph_api):
    model, reference = models(graph_config())
    buffer = torch.randn(2, 8)
    run(model, buffer)
    run(model, buffer)  # captured
    buffer.zero_()
    with counters.expect(num_graphs_captured=0):
        torch.testing.assert_close(run(model, buffer), reference(torch.zeros(2, 8)))


def test_a_fresh_input_tensor_raises_on_the_first_replay(graph_api):
    model, _ = models(graph_config())
    buffer = torch.randn(2, 8)
    run(model, buffer)
    run(model, buffer)
    with pytest.raises(StaticGraphError, match=r"piece 0 of 3, capture size 2: input \d+"):
        run(model, torch.randn(2, 8))


def test_debug_checks_check_every_replay_not_only_the_first(graph_api):
    for debug_checks, raises in ((False, False), (True, True)):
        model, _ = models(graph_config(debug_checks=debug_checks))
        buffer = torch.randn(1, 8)
        for _ in range(3):
            run(model, buffer)  # warm-up, capture, first (checked) replay
        try:
            run(model, torch.randn(1, 8))
            raised = False
        except StaticGraphError:
            raised = True
        assert raised is raises


def test_sizes_outside_capture_sizes_run_uncaptured_and_correct(graph_api):
    model, reference = models(graph_config())
    with counters.expect(num_graphs_captured=0):
        for size in (3, 4, 64):
            for _ in range(3):
                x = torch.randn(size, 8)
                torch.testing.assert_close(run(model, x), reference(x))


def test_forward_context_selects_the_runtime_mode(graph_api):
    model, reference = models(graph_config())
    buffer = torch.randn(2, 8)
    with counters.expect(num_graphs_captured=0):
        for _ in range(3):
            with set_forward_context(None, graph_mode="NONE"):
                torch.testing.assert_close(model(buffer), reference(buffer))
    with (
        set_forward_context(None, graph_mode="PIECEWISE"),
        pytest.raises(StaticGraphError, match="size 3 is not a capture size"),
    ):
        model(torch.randn(3, 8))


@pytest.mark.parametrize("uniform_decode, captured", [(True, 1), (False, 3)])
def test_full_and_piecewise_picks_full_for_uniform_decode(graph_api, uniform_decode, captured):
    model, reference = models(graph_config(graph_mode="FULL_AND_PIECEWISE"))
    buffer = torch.randn(2, 8)
    with counters.expect(num_graphs_captured=captured):
        for _ in range(3):
            out = run(model, buffer, uniform_decode=uniform_decode)
            torch.testing.assert_close(out, reference(buffer))


@pytest.mark.parametrize("graph_mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_a_forward_context_without_a_mode_runs_no_graphs(graph_api, graph_mode):
    # Only the dispatcher decides: a call at a capture size that carries no mode, with or
    # without a batch descriptor, runs plainly.
    model, reference = models(graph_config(graph_mode=graph_mode))
    buffer = torch.randn(2, 8)
    descriptor = BatchDescriptor(num_tokens=2, uniform_decode=True)
    with counters.expect(num_graphs_captured=0):
        for _ in range(3):
            torch.testing.assert_close(model(buffer), reference(buffer))
            with set_forward_context(None, batch_descriptor=descriptor):
                torch.testing.assert_close(model(buffer), reference(buffer))
    assert graph_api.captures == []


@pytest.mark.parametrize("carried, captured", [("PIECEWISE", 3), ("FULL", 1), ("NONE", 0)])
def test_the_mode_the_context_carries_is_trusted_over_the_batch_descriptor(
    graph_api, carried, captured
):
    # The dispatcher decides a step's mode once and the context carries it; the wrappers
    # do not work it out again: a uniform decode (FULL by the dispatcher) runs the graphs
    # carried.
    model, reference = models(graph_config(graph_mode="FULL_AND_PIECEWISE"))
    buffer = torch.randn(2, 8)
    descriptor = BatchDescriptor(num_tokens=2, uniform_decode=True)
    with counters.expect(num_graphs_captured=captured):
        for _ in range(3):
            with set_forward_context(None, graph_mode=carried, batch_descriptor=descriptor):
                torch.testing.assert_close(model(buffer), reference(buffer))


def test_full_graph_mode_captures_the_whole_model_once_per_size(graph_api):
    model, reference = models(graph_config(graph_mode="FULL"))
    buffer = torch.randn(1, 8)
    with counters.expect(num_graphs_captured=1):
        for _ in range(3):
            torch.testing.assert_close(run(model, buffer), reference(buffer))
    buffer.fill_(0.5)
    torch.testing.assert_close(run(model, buffer), reference(buffer))


def test_capture_after_the_window_closed_is_an_error(graph_api):
    model, _ = models(graph_config())
    try:
        with capture_window():
            buffer = torch.randn(1, 8)
            for _ in range(2):
                run(model, buffer)
        run(model, buffer)  # a captured size still replays
        fresh_size = torch.randn(2, 8)
        run(model, fresh_size)  # warm-up is allowed
        with pytest.raises(StaticGraphError, match="after the capture window closed"):
            run(model, fresh_size)
    finally:
        reset_capture_window()


def test_graph_warmups_delay_the_capture(graph_api):
    model, _ = models(graph_config(graph_warmups=3))
    buffer = torch.randn(1, 8)
    with counters.expect(num_graphs_captured=0):
        for _ in range(3):
            run(model, buffer)
    with counters.expect(num_graphs_captured=3):
        run(model, buffer)


def test_a_stub_replay_uses_what_the_capture_read_on_the_host(graph_api):
    # A device graph replays the metadata its capture saw; a recorded graph must not be kinder.
    graph = graph_api.new_graph()
    buffer = torch.ones(2)
    calls = []

    def work() -> torch.Tensor:
        calls.append("run")
        return buffer * get_forward_context().attn_metadata

    with set_forward_context(3.0):
        out = graph.capture(work, graph_api.pool(), quiet=False)
    buffer.fill_(2.0)
    with set_forward_context(5.0):
        graph.replay()
    assert calls == ["run"]  # Python ran once, at capture
    assert out.tolist() == [6.0, 6.0]  # new data in the buffer, the captured host value


def test_graph_mode_none_never_captures_whatever_the_forward_context_says(graph_api):
    model, reference = models(graph_config(graph_mode="NONE"))
    buffer = torch.randn(2, 8)
    with counters.expect(num_graphs_captured=0):
        for mode in ("PIECEWISE", "FULL", "PIECEWISE", "PIECEWISE"):
            with set_forward_context(None, graph_mode=mode):
                torch.testing.assert_close(model(buffer), reference(buffer))
    assert graph_api.captures == []


@pytest.mark.parametrize("graph_mode, graphs_per_size", [("PIECEWISE", 3), ("FULL", 1)])
def test_graph_copy_inputs_takes_fresh_tensors_every_call(graph_api, graph_mode, graphs_per_size):
    model, reference = models(graph_config(graph_mode=graph_mode, graph_copy_inputs=True))
    with counters.expect(num_graphs_captured=2 * graphs_per_size):
        for size in (1, 2):
            for _ in range(4):  # warm-up, capture, two replays: a new tensor every time
                x = torch.randn(size, 8)
                torch.testing.assert_close(run(model, x), reference(x))


def test_graph_copy_inputs_still_checks_the_tensors_it_does_not_copy(graph_api):
    model, _ = models(graph_config(graph_copy_inputs=True))
    for _ in range(2):
        run(model, torch.randn(2, 8))
    with torch.no_grad():
        model.proj_in.weight.data = model.proj_in.weight.data.clone()  # a weight moves
    with pytest.raises(StaticGraphError, match="piece 0 of 3, capture size 2: input"):
        run(model, torch.randn(2, 8))
