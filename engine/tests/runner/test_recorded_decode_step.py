"""Recorded decode steps: once a captured size's graphs are checked, a uniform decode of
that size replays a recorded list of calls (no graph wrapper, no model call), gives
eager's logits over many steps while requests join and leave, and falls back to the
normal path whenever what it recorded went stale.

The recorded graph API replays what its capture recorded on the captured tensors, so a
recorded call on a stale tensor or a skipped call gives wrong logits."""

from __future__ import annotations

import pytest
import torch
from runner_cases import (  # noqa: F401 - the fixture is used by name
    Twins,
    _lazy_captures_after_each_test,
)

from slotwise.attention import allocate_kv_caches
from slotwise.compilation import StaticGraphError
from slotwise.compilation.compiled_modules import compiled_forward_of
from slotwise.compilation.static_graphs import recorded_step
from slotwise.compilation.static_graphs.wrapper import StaticGraphWrapper
from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_cpu.attention import CpuSdpaBackend

#: Graph mode -> an attention backend that can be captured in it.
MODES = {"PIECEWISE": CpuSdpaBackend, "FULL_AND_PIECEWISE": AscendStubReferenceBackend}


class Counting:
    """Counts graph-wrapper calls and recorded-step runs, per step."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wrapper_calls = 0
        self.recorded_runs = 0
        wrapper_call = StaticGraphWrapper.__call__
        run = recorded_step.RecordedStep.run

        def counted_call(wrapper, *args):
            self.wrapper_calls += 1
            return wrapper_call(wrapper, *args)

        def counted_run(step, metadata):
            self.recorded_runs += 1
            return run(step, metadata)

        monkeypatch.setattr(StaticGraphWrapper, "__call__", counted_call)
        monkeypatch.setattr(recorded_step.RecordedStep, "run", counted_run)

    def reset(self) -> None:
        self.wrapper_calls = self.recorded_runs = 0


def decoding_twins(graph_mode: str, names: tuple[str, ...] = ("a", "b", "c")) -> Twins:
    """Twins with three requests prefilled and decoded until size 4 is recorded."""
    twins = Twins(graph_mode)
    for i, name in enumerate(names):
        twins.join(name, [3 + i, 1, 4][: 2 + i % 2])
    twins.step(list(names))  # the prefill
    for _ in range(4):
        twins.step(list(names))  # 3 decodes, padded to 4: warm-up, capture, check
    assert 4 in twins.recorded()
    return twins


@pytest.mark.slow
@pytest.mark.parametrize("graph_mode", list(MODES))
def test_recorded_decodes_match_eager_and_skip_the_wrappers(
    graph_platform_with, monkeypatch, graph_mode
):
    graph_platform_with(MODES[graph_mode])
    counting = Counting(monkeypatch)
    twins = decoding_twins(graph_mode)
    for _ in range(16):  # every request crosses from its first block into its second
        counting.reset()
        twins.step(["a", "b", "c"])
        assert (counting.recorded_runs, counting.wrapper_calls) == (1, 0)
    assert all(len(r[0].tokens) > 16 for r in twins.requests.values())
    twins.leave("b")
    twins.join("d", [9])  # a one-token prompt: its prefill is a decode, padded to 4 too
    for _ in range(3):
        counting.reset()
        twins.step(["c", "d", "a"])
        assert (counting.recorded_runs, counting.wrapper_calls) == (1, 0)
    twins.join("e", [2, 7, 1, 8])
    counting.reset()
    twins.step(["a", "c", "d", "e"])  # mixed: never recorded, runs through the wrappers
    assert counting.recorded_runs == 0 and counting.wrapper_calls > 0
    assert all(g.uniform_decode for g in twins.graph.recorded_steps)


def test_a_size_is_recorded_only_once_its_graphs_are_checked(graph_platform_with):
    graph_platform_with(CpuSdpaBackend)
    twins = Twins("PIECEWISE")
    twins.join("a", [3, 1, 4])
    twins.step(["a"])
    twins.step(["a"])  # size 1's first call: a warm-up, no graph yet
    assert twins.recorded() == []
    for _ in range(3):
        twins.step(["a"])
    assert twins.recorded() == [1]


@pytest.mark.parametrize("graph_mode", list(MODES))
def test_a_replaced_parameter_drops_the_recording_and_is_refused_by_the_graphs(
    graph_platform_with, monkeypatch, graph_mode
):
    graph_platform_with(MODES[graph_mode])
    twins = decoding_twins(graph_mode)
    (step,) = twins.graph.recorded_steps.values()
    for runner in twins.runners:
        norm = runner.model.model.norm
        norm.weight = torch.nn.Parameter(norm.weight.detach() * 2)  # a new tensor
    assert "registered since the recording" in (step.stale() or "")
    # The captured graphs read the old weight's memory: refused, never a silent old result.
    with pytest.raises(StaticGraphError, match="replaced after capture"):
        twins.step(["a", "b", "c"])


@pytest.mark.parametrize("graph_mode", list(MODES))
def test_a_weight_changed_in_place_is_followed_by_the_recorded_steps(
    graph_platform_with, monkeypatch, graph_mode
):
    graph_platform_with(MODES[graph_mode])
    counting = Counting(monkeypatch)
    twins = decoding_twins(graph_mode)
    for runner in twins.runners:
        runner.model.model.norm.weight.data.mul_(2)
    for _ in range(2):
        counting.reset()
        twins.step(["a", "b", "c"])  # compared with eager on the changed weight
        assert counting.recorded_runs == 1


def test_a_recapture_drops_the_recording(graph_platform_with, monkeypatch):
    graph_platform_with(CpuSdpaBackend)
    counting = Counting(monkeypatch)
    twins = decoding_twins("PIECEWISE")
    (step,) = twins.graph.recorded_steps.values()
    step._replays[1].wrapper.entries.clear()  # the piece is captured again from scratch
    assert "dropped or recaptured" in step.stale()
    counting.reset()
    twins.graph.step([twins.requests[name][0] for name in ("a", "b", "c")])
    assert counting.recorded_runs == 0 and 4 not in twins.recorded()


def test_a_reallocated_kv_cache_drops_the_recording(graph_platform_with):
    graph_platform_with(CpuSdpaBackend)
    twins = decoding_twins("PIECEWISE")
    (step,) = twins.graph.recorded_steps.values()
    allocate_kv_caches(twins.graph.model, 32)
    assert "KV cache" in step.stale()


def test_a_new_model_entry_drops_the_recording(graph_platform_with, monkeypatch):
    graph_platform_with(CpuSdpaBackend)
    counting = Counting(monkeypatch)
    twins = decoding_twins("PIECEWISE")
    compiled = compiled_forward_of(twins.graph.model.model)
    entry = compiled.compiled
    compiled.compiled = lambda *args, **kwargs: entry(*args, **kwargs)  # a new trace's
    (step,) = twins.graph.recorded_steps.values()
    assert "has a new entry" in step.stale()
    counting.reset()
    twins.step(["a", "b", "c"])
    assert counting.recorded_runs == 0 and counting.wrapper_calls > 0
    # An entry other than slotwise's direct entry is never recorded (one warning).
    assert twins.graph.recorded_steps is None
