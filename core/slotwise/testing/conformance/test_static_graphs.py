"""Check ``static_graphs``: a platform declaring static graphs keeps their contract.

Only for platforms whose ``get_graph_api()`` returns a GraphAPI.  With capture sizes
[1, 2] and graph mode PIECEWISE each of SillyModel's three capturable pieces runs
once plainly (warm-up), is captured on its second call and replayed after that.
The static-graph contract (docs/design.md) is what makes replays safe: a replay reads its inputs
from the addresses captured, so new data copied into the captured buffer is seen;
a new input tensor is detected on the first replay and raises ``StaticGraphError``.
"""

from __future__ import annotations

import torch

from slotwise.compilation import CompilationConfig, StaticGraphError, counters
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


def graph_config() -> CompilationConfig:
    if target.platform().get_graph_api() is None:
        target.skip("get_graph_api() returns None, so there is no static-graph contract")
    return level3_config(capture_sizes=list(CAPTURE_SIZES), graph_mode="PIECEWISE", graph_warmups=1)


def test_each_size_captures_once_and_replays_match_eager() -> None:
    model, reference = twin_models(graph_config())
    wrong = []
    try:
        with counters.expect(num_graphs_captured=len(CAPTURE_SIZES) * CAPTURABLE_PIECES):
            for size in CAPTURE_SIZES:
                buffer = torch.empty(size, HIDDEN, device=target.platform().device_type)
                for run, name in enumerate(RUNS):
                    buffer.copy_(inputs(size, seed=10 * size + run))
                    difference = first_difference(model(buffer), reference(buffer))
                    if difference:
                        wrong.append(f"size {size}, {name} run: {difference}")
    except AssertionError as exc:
        target.fail(
            f"running capture sizes {list(CAPTURE_SIZES)} three times each (warm-up, capture, "
            f"replay) over {CAPTURABLE_PIECES} capturable pieces must capture "
            f"{len(CAPTURE_SIZES) * CAPTURABLE_PIECES} graphs: {exc}"
        )
    if wrong:
        target.fail(
            "with static graphs the outputs differ from eager, with new data copied into the "
            "same input buffer before each run: " + "; ".join(wrong)
        )


def test_replay_reads_new_data_from_the_captured_buffer() -> None:
    model, reference = twin_models(graph_config())
    buffer = inputs(2, seed=1)
    model(buffer)  # warm-up
    model(buffer)  # capture
    buffer.zero_()
    with counters.expect(num_graphs_captured=0):
        difference = first_difference(model(buffer), reference(torch.zeros_like(buffer)))
    if difference:
        target.fail(
            "after zeroing the captured input buffer, the replay does not give the eager "
            f"result for zeros: {difference}; a replay must read its inputs from the "
            "captured addresses"
        )


def test_a_fresh_input_tensor_at_a_captured_size_raises() -> None:
    model, _ = twin_models(graph_config())
    buffer = inputs(2, seed=2)
    model(buffer)  # warm-up
    model(buffer)  # capture
    fresh = torch.empty(2, HIDDEN, device=buffer.device).copy_(buffer)
    try:
        model(fresh)
    except StaticGraphError:
        return
    target.fail(
        "replaying capture size 2 with a new input tensor (another address) did not raise "
        "slotwise.compilation.StaticGraphError; the static-graph contract requires the "
        "input addresses to be checked on the first replay of each size"
    )
