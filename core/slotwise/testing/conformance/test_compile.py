"""Check ``compile``: level 3 splits, compiles and runs pieces through the platform's backend.

``SillyModel`` has two splitting ops, so Dynamo's one graph splits into five pieces
of which three are capturable, each run by a piecewise backend (the platform's own
from ``get_piecewise_backend_cls()``, else slotwise's).
Static graphs are off here (``graph_mode`` NONE), so fresh inputs of any size are
fine; the static-graph check covers capture.
"""

from __future__ import annotations

from slotwise.compilation import counters
from slotwise.testing.conformance import target
from slotwise.testing.conformance.toy_setup import (
    first_difference,
    inputs,
    level3_config,
    twin_models,
)

#: Sizes after the first call: none may trace again, all must match eager.
SIZES = (1, 2, 3, 5, 8, 17, 64)


def test_level3_splits_into_five_pieces_three_capturable() -> None:
    model, reference = twin_models(level3_config(graph_mode="NONE"))
    x = inputs(4, seed=0)
    try:
        with counters.expect(
            num_models_seen=1,
            num_graphs_seen=1,
            num_piecewise_graphs_seen=5,
            num_piecewise_capturable_graphs_seen=3,
            num_graphs_captured=0,
        ):
            out = model(x)
    except AssertionError as exc:
        target.fail(f"SillyModel at level 3 (2 splitting ops, eager backend): {exc}")
    difference = first_difference(out, reference(x))
    if difference:
        target.fail(f"SillyModel at level 3 differs from level 0 for 4 tokens: {difference}")


def test_level3_matches_eager_for_every_size_without_tracing_again() -> None:
    model, reference = twin_models(level3_config(graph_mode="NONE"))
    model(inputs(4, seed=0))
    wrong = []
    try:
        with counters.expect(num_graphs_seen=0, num_graphs_captured=0):
            for size in SIZES:
                x = inputs(size, seed=size)
                difference = first_difference(model(x), reference(x))
                if difference:
                    wrong.append(f"{size} tokens: {difference}")
    except AssertionError as exc:
        target.fail(f"SillyModel at level 3, after its first call: {exc}")
    if wrong:
        target.fail("SillyModel at level 3 differs from level 0 for " + "; ".join(wrong))
