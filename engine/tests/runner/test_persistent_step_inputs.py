"""The runner's persistent step inputs: requests join, grow and leave between steps, and
every graph mode still gives eager's logits, with a block table that never changes width
and graphs that read the runner's own buffers in place.

The recorded graph API replays what its capture recorded on the captured tensors, so a step
whose inputs or metadata were not written where the graph reads them gives wrong logits.
"""

from __future__ import annotations

import pytest
from runner_cases import (  # noqa: F401 - the fixture is used by name
    MAX_MODEL_LEN,
    Twins,
    _lazy_captures_after_each_test,
)

from slotwise_ascend_stub.attention import AscendStubReferenceBackend
from slotwise_cpu.attention import CpuSdpaBackend
from slotwise_engine.runner import model_runner

#: Graph mode -> an attention backend that can be captured in it.
MODES = {
    "NONE": CpuSdpaBackend,
    "PIECEWISE": CpuSdpaBackend,
    "FULL_AND_PIECEWISE": AscendStubReferenceBackend,
}


@pytest.fixture
def spied_steps(monkeypatch):
    """Every step's attention metadata, as the model receives it."""
    seen = []
    original = model_runner.set_forward_context

    def spy(metadata, **kwargs):
        seen.append(metadata)
        return original(metadata, **kwargs)

    monkeypatch.setattr(model_runner, "set_forward_context", spy)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("graph_mode", list(MODES))
def test_requests_joining_growing_and_leaving_match_eager(
    graph_platform_with, spied_steps, graph_mode
):
    graph_platform_with(MODES[graph_mode])
    twins = Twins(graph_mode)
    twins.join("a", [3, 1, 4])
    twins.step(["a"])  # a prefill of 3 tokens, padded to 4
    for _ in range(3):
        twins.step(["a"])  # first calls of size 1: warm-up, capture, replay
    twins.join("b", [2, 7])
    twins.step(["b", "a"])  # mixed: the new request first; the runner puts decodes first
    for _ in range(3):
        twins.step(["a", "b"])  # first calls of size 2
    twins.join("c", [5] * 14)
    twins.step(["a", "b", "c"])  # 16 tokens: above the largest capture size, no graphs
    twins.leave("a")
    twins.join("d", [9])  # a one-token prompt: its prefill is a decode
    for _ in range(4):  # c crosses from its first block into its second
        twins.step(["c", "d", "b"])  # 3 decodes, padded to 4
    assert len(twins.requests["c"][0].tokens) > 16
    twins.leave("b")
    twins.step(["d", "c"])

    widths = {metadata.block_table.shape[1] for metadata in spied_steps if metadata is not None}
    assert widths == {MAX_MODEL_LEN // 16}


def test_replays_read_the_runners_buffers_in_place(graph_platform_with, spied_steps):
    api = graph_platform_with(AscendStubReferenceBackend)
    twins = Twins("FULL_AND_PIECEWISE")
    runner = twins.runners[0]
    runner.capture(progress=False)
    inputs = []
    run = runner._run
    runner._run = lambda graphs, ids, positions, metadata: (
        inputs.append((ids, positions)) or run(graphs, ids, positions, metadata)
    )
    twins.join("a", [3, 1, 4])
    twins.join("b", [2, 7, 1])
    twins.join("c", [8, 8])
    twins.step(["a", "b", "c"])  # the prefill: pieces, attention between them
    spied_steps.clear()
    replays = api.replays
    twins.step(["a", "b", "c"])  # a uniform decode of 3, padded to 4: one FULL replay
    assert api.replays - replays == 1

    buffers = runner.step_inputs.graph
    ids, positions = inputs[-1]
    assert ids.data_ptr() == buffers.input_ids.data_ptr() and ids.storage_offset() == 0
    assert positions.data_ptr() == buffers.positions.data_ptr()
    assert positions.storage_offset() == 0
    metadata = spied_steps[0]  # the graph runner's step; the eager twin's comes second
    for name in ("query_start_loc", "seq_lens", "slot_mapping", "block_table"):
        read = getattr(metadata, name)
        assert read.data_ptr() == getattr(buffers.metadata, name).data_ptr(), name
        assert read.data_ptr() == getattr(runner.static_metadata, name).data_ptr(), name
    # The padding request decodes on the scratch block.
    assert metadata.block_table[3, 0].item() == runner.static_metadata.scratch_block
    assert metadata.seq_lens.tolist()[3] == 1


def test_a_block_table_row_is_written_only_when_its_request_changes(graph_platform_with):
    graph_platform_with(CpuSdpaBackend)
    twins = Twins("PIECEWISE")
    runner = twins.runners[0]
    twins.join("a", [3, 1, 4])
    twins.join("b", [2, 7])
    twins.step(["a", "b"])
    table = runner.step_inputs.graph.host_metadata.block_table
    first = runner.step_inputs.graph.rows[:2]
    table[:2, 1:] = -1  # blocks no token is in yet: a rewrite would restore them
    twins.step(["a", "b"])
    assert (table[:2, 1:] == -1).all()
    assert runner.step_inputs.graph.rows[:2] == first
    twins.leave("a")
    twins.step(["b"])  # b moves to row 0: rewritten
    assert table[0].tolist() == twins.requests["b"][0].block_ids


def test_padding_rows_never_hold_what_a_larger_step_left(graph_platform_with):
    """A step-wide reduction over the padded rows (dynamic rope takes the step's largest
    position) sees only this step's values."""
    graph_platform_with(CpuSdpaBackend)
    twins = Twins("PIECEWISE")
    runner = twins.runners[0]
    seen = []
    run = runner._run
    runner._run = lambda graphs, ids, positions, metadata: (
        seen.append((ids.tolist(), positions.tolist())) or run(graphs, ids, positions, metadata)
    )
    twins.join("long", list(range(1, 9)))
    twins.step(["long"])  # 8 tokens at positions 0-7
    twins.leave("long")
    for name in ("a", "b", "c"):
        twins.join(name, [5])
    twins.step(["a", "b", "c"])  # 3 one-token prompts, padded to 4
    ids, positions = seen[-1]
    assert positions == [0, 0, 0, 0] and ids == [5, 5, 5, 0]
