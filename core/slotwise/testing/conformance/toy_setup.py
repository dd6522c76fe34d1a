"""``SillyModel`` twins for the compile and static-graph checks.

Both checks compare a model compiled at level 3 with an uncompiled copy holding the
same weights, on the platform's device, through the piecewise backend slotwise picks
for the platform (its own, if it has one) and the compiler slotwise compiles models with
there: the config's backend is left "" so that, as for any model, the platform's
``check_and_update_config`` and then its ``default_compile_backend`` choose it.  The
persistent compile cache is off so a check never reads or writes the user's cache.
Outputs are compared on the host.
"""

from __future__ import annotations

from typing import Any

import torch

from slotwise.compilation import CompilationConfig
from slotwise.testing.conformance import target
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel

#: Width of SillyModel's inputs: [num_tokens, HIDDEN].
HIDDEN = 8


def level3_config(**changes: Any) -> CompilationConfig:
    fields: dict[str, Any] = {
        "level": 3,
        "backend": "",  # the platform's choice, as for every model
        "splitting_ops": TOY_SPLITTING_OPS,
        "disable_cache": True,
    }
    fields.update(changes)
    return CompilationConfig(**fields)


def twin_models(config: CompilationConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """SillyModel compiled with ``config``, and an eager copy with the same weights."""
    device = target.platform().device_type
    torch.manual_seed(0)
    model = SillyModel(compilation_config=config).to(device)
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0)).to(device)
    return model, reference


def inputs(size: int, seed: int) -> torch.Tensor:
    """Random [size, HIDDEN] inputs on the platform's device."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, HIDDEN, generator=generator).to(target.platform().device_type)


def compile_backend(model: torch.nn.Module) -> str:
    """The compiler slotwise chose for ``model``, a marked model built with a config."""
    from slotwise.compilation import compiled_forward_of

    compiled = compiled_forward_of(model)
    return compiled.config.backend if compiled is not None else "?"


def first_difference(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why ``got`` is not ``expected`` (shapes or values), or None when they are close;
    compared on the host."""
    got, expected = target.host(got), target.host(expected)
    try:
        torch.testing.assert_close(got, expected)
    except AssertionError as exc:
        return str(exc).strip().splitlines()[0] + (
            f" (max |error| {float((got - expected).abs().max()):.3g})"
            if got.shape == expected.shape
            else ""
        )
    return None
