"""Check ``compile``: level 3 splits, compiles and runs pieces as slotwise would on the platform.

``SillyModel`` has two splitting ops, so Dynamo's one graph splits into five pieces
of which three are capturable, each run by a piecewise backend (the platform's own
from ``get_piecewise_backend_cls()``, else slotwise's) and compiled by the compiler
slotwise picks for every model there: ``default_compile_backend``, unless
``check_and_update_config`` sets another.  A default compiler that cannot compile for
the device fails here, not in a user's first model.  Static graphs are off here
(``graph_mode`` NONE), so fresh inputs of any size are fine; the static-graph check
covers capture.
"""

from __future__ import annotations

import torch

from slotwise.compilation import counters
from slotwise.testing.conformance import target
from slotwise.testing.conformance.toy_setup import (
    compile_backend,
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
    what = f"SillyModel at level 3 (2 splitting ops, {describe_backend(model)})"
    try:
        with counters.expect(
            num_models_seen=1,
            num_graphs_seen=1,
            num_piecewise_graphs_seen=5,
            num_piecewise_capturable_graphs_seen=3,
            num_graphs_captured=0,
        ):
            out = first_call(model, x, what)
    except AssertionError as exc:
        target.fail(f"{what}: {exc}")
    difference = first_difference(out, reference(x))
    if difference:
        target.fail(f"{what} differs from level 0 for 4 tokens: {difference}")


def test_level3_matches_eager_for_every_size_without_tracing_again() -> None:
    model, reference = twin_models(level3_config(graph_mode="NONE"))
    what = f"SillyModel at level 3 ({describe_backend(model)})"
    first_call(model, inputs(4, seed=0), what)
    wrong = []
    try:
        with counters.expect(num_graphs_seen=0, num_graphs_captured=0):
            for size in SIZES:
                x = inputs(size, seed=size)
                difference = first_difference(model(x), reference(x))
                if difference:
                    wrong.append(f"{size} tokens: {difference}")
    except AssertionError as exc:
        target.fail(f"{what}, after its first call: {exc}")
    if wrong:
        target.fail(f"{what} differs from level 0 for " + "; ".join(wrong))


def describe_backend(model: torch.nn.Module) -> str:
    platform = target.platform()
    backend = compile_backend(model)
    if backend == platform.default_compile_backend:
        return f"compile backend {backend!r}, the platform's default_compile_backend"
    return (
        f"compile backend {backend!r}, set by check_and_update_config over "
        f"default_compile_backend {platform.default_compile_backend!r}"
    )


def first_call(model: torch.nn.Module, x: torch.Tensor, what: str) -> torch.Tensor:
    """The first call, which traces and compiles; an exception fails the check."""
    try:
        return model(x)
    except Exception as exc:  # noqa: BLE001 - reported with the compiler that raised it
        target.fail(
            f"{what} does not compile and run on the device: {type(exc).__name__}: {exc}. "
            "slotwise compiles every model at level 3 with this backend unless a config "
            "names another: set default_compile_backend to a compiler that targets the "
            "device ('eager' runs the traced graph as is)"
        )
