"""The ModelRunner on a graph platform (CPU graph API): capture at start-up, pad, replay."""

from __future__ import annotations

import pytest
import torch

from slotwise.compilation import CompilationConfig, counters
from slotwise.compilation.static_graphs.contract import reset_capture_window
from slotwise_engine.models.llama import PRESETS, build_llama
from slotwise_engine.runner.model_runner import ModelRunner
from slotwise_engine.serving.generation import generate_token_ids

PROMPTS = [[1, 5, 9, 3], [7, 7, 2], [42, 11, 100]]


@pytest.fixture
def runner(graph_api):
    config = CompilationConfig(level=3, backend="eager", capture_sizes=[1, 2, 4, 8])
    model = build_llama("tiny", seed=0, compilation_config=config)
    runner = ModelRunner(model, num_blocks=32)
    yield runner
    reset_capture_window()


def test_capture_step_captures_every_piece_for_every_size(runner):
    pieces = PRESETS["tiny"].num_layers + 1
    with counters.expect(num_graphs_captured=4 * pieces):
        reports = runner.capture(progress=False)
    assert [report.size for report in reports] == [8, 4, 2, 1]


def test_generation_with_graphs_matches_eager(runner, graph_api):
    runner.capture(progress=False)
    replays_before = graph_api.replays
    with counters.expect(num_graphs_captured=0):
        tokens = generate_token_ids(runner, PROMPTS, 5)
    # Decode steps of 3 tokens are padded to the captured size 4 and replayed.
    assert graph_api.replays > replays_before
    eager = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    assert tokens == generate_token_ids(ModelRunner(eager, num_blocks=32), PROMPTS, 5)


def test_padded_sizes(runner):
    assert [runner.padded_size(n) for n in (1, 3, 5, 8, 9)] == [1, 4, 8, 8, 9]


def test_a_steps_tokens_are_written_into_the_graph_buffers(runner):
    runner.capture(progress=False)
    sequences = runner.add_requests([[3, 4, 5]], 1)
    logits = runner.step(sequences)
    assert logits.shape == (1, PRESETS["tiny"].vocab_size)
    # Padded to 4: the padding row's token id is zeroed.
    assert runner.step_inputs.graph.input_ids[:4].tolist() == [3, 4, 5, 0]
    assert runner.step_inputs.graph.positions[:4].tolist() == [0, 1, 2, 0]


def test_inputs_made_by_the_caller_are_copied_into_the_graph_buffers(runner):
    runner.capture(progress=False)
    sequences = runner.add_requests([[3, 4, 5]], 1)
    metadata = runner.metadata_builder.build([3], [0], [sequences[0].block_ids])
    hidden = runner.execute(torch.tensor([3, 4, 5]), torch.arange(3), metadata)
    assert hidden.shape[0] == 3
    assert runner.step_inputs.graph.input_ids[:4].tolist() == [3, 4, 5, 0]


def test_a_model_compiled_with_slotwise_compile_runs_with_graphs(graph_api):
    """The runner finds a compilation made by slotwise.compile() as it finds one made by
    @support_torch_compile, so the model is captured and replayed, not run without graphs."""
    import slotwise

    model = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    config = CompilationConfig(level=3, backend="eager", capture_sizes=[1, 2, 4])
    slotwise.compile(model.model, config, dynamic_arg_dims={"input_ids": 0, "positions": 0})
    runner = ModelRunner(model, num_blocks=32)
    try:
        assert runner.capture_sizes == [1, 2, 4]
        with counters.expect(num_graphs_captured=3 * (PRESETS["tiny"].num_layers + 1)):
            runner.capture(progress=False)
        tokens = generate_token_ids(runner, PROMPTS, 4)
    finally:
        reset_capture_window()
    assert graph_api.replays > 0
    eager = build_llama("tiny", seed=0, compilation_config=CompilationConfig(level=0))
    assert tokens == generate_token_ids(ModelRunner(eager, num_blocks=32), PROMPTS, 4)
