"""Check ``custom_ops``: what the platform runs for each core custom op equals ``forward_native``.

A layer picks its implementation once, at construction: a replacement a plugin
registered for this platform (hook ``slotwise_register_custom_ops``), else the
class's ``forward_<custom_op_key>``, else ``forward_native``.  The layers are
built at compilation level 0, where every custom op is enabled, so what runs is
the platform's own code; a registered replacement must actually be the one chosen.
The ops that run inside compiled models are then compiled as level 3 compiles a
model, with the batch size a symbol, and called with 1, then more, tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import slotwise
from slotwise.compilation import (
    CompilationConfig,
    SizeSpecializationError,
    set_compilation_config,
)
from slotwise.custom_op import CustomOp, get_custom_op_registry
from slotwise.distributed.parallel_layers import ParallelLMHead
from slotwise.layers import LogitsHead, RMSNorm, RotaryEmbedding, SiluAndMul
from slotwise.testing.conformance import target

NUM_TOKENS = 7
HIDDEN = 64
HEAD_SIZE = 64
MAX_POSITION = 128
VOCAB = 256
TOLERANCE = 1e-4


def rms_norm(generator: torch.Generator) -> tuple[CustomOp, list[tuple[Any, ...]]]:
    layer = RMSNorm(HIDDEN)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(HIDDEN, generator=generator))
    x, residual = torch.randn(2, NUM_TOKENS, HIDDEN, generator=generator)
    return layer, [(x,), (x, residual)]


def silu_and_mul(generator: torch.Generator) -> tuple[CustomOp, list[tuple[Any, ...]]]:
    return SiluAndMul(), [(torch.randn(NUM_TOKENS, 2 * HIDDEN, generator=generator),)]


def rotary_embedding(generator: torch.Generator) -> tuple[CustomOp, list[tuple[Any, ...]]]:
    layer = RotaryEmbedding(HEAD_SIZE, MAX_POSITION)
    positions = torch.randint(MAX_POSITION, (NUM_TOKENS,), generator=generator)
    query = torch.randn(NUM_TOKENS, 4 * HEAD_SIZE, generator=generator)
    key = torch.randn(NUM_TOKENS, 2 * HEAD_SIZE, generator=generator)
    return layer, [(positions, query, key)]


def logits(generator: torch.Generator) -> tuple[CustomOp, list[tuple[Any, ...]]]:
    lm_head = ParallelLMHead(VOCAB, HIDDEN)
    with torch.no_grad():
        lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator))
    rows = [torch.randn(n, HIDDEN, generator=generator) for n in (1, 3, NUM_TOKENS)]
    return LogitsHead(), [(lm_head, hidden) for hidden in rows]


#: Each core op by name: builds the layer (on the CPU) and the argument tuples to call it with.
BUILDERS: dict[str, Callable[[torch.Generator], tuple[CustomOp, list[tuple[Any, ...]]]]] = {
    "rms_norm": rms_norm,
    "silu_and_mul": silu_and_mul,
    "rotary_embedding": rotary_embedding,
    "logits": logits,
}


@pytest.mark.parametrize("op_name", BUILDERS)
def test_custom_op_matches_forward_native(op_name: str) -> None:
    platform = target.platform()
    replaced = (op_name, platform.name) in get_custom_op_registry().entries()
    with set_compilation_config({"level": 0}):
        layer, calls = BUILDERS[op_name](torch.Generator().manual_seed(0))
    if replaced and layer.implementation != "plugin":
        target.fail(
            f"a replacement of custom op {op_name!r} is registered for this platform, but "
            f"{type(layer).__name__} chose its {layer.implementation!r} implementation"
        )
    device = platform.device_type
    layer.to(device)
    for args in calls:
        args = tuple(a.to(device) for a in args)
        got, expected = layer(*args), layer.forward_native(*args)
        try:
            torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=TOLERANCE)
        except AssertionError as exc:
            shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))
            target.fail(
                f"custom op {op_name!r} ({layer.implementation} implementation) differs from "
                f"forward_native for arguments of shapes {shapes}: {exc}"
            )


class _OneCall(torch.nn.Module):
    """A model that calls ``layer`` once, so level 3 compiles the op as part of a model."""

    def __init__(self, layer: CustomOp) -> None:
        super().__init__()
        self.layer = layer

    def forward(
        self,
        first: torch.Tensor,
        second: torch.Tensor | None = None,
        third: torch.Tensor | None = None,
    ) -> Any:
        return self.layer(*(arg for arg in (first, second, third) if arg is not None))


#: Tokens per call: one first (a trace must not take its size for a constant), then more.
TRACED_SIZES = (1, NUM_TOKENS, 2)


@pytest.mark.parametrize("op_name", [name for name in BUILDERS if name != "logits"])
def test_custom_op_compiles_at_level_3_for_every_batch_size(op_name: str) -> None:
    import torch._dynamo  # here, not at collection: it imports Triton

    platform = target.platform()
    config = CompilationConfig(level=3, backend="eager", graph_mode="NONE", disable_cache=True)
    with set_compilation_config(config):
        layer, calls = BUILDERS[op_name](torch.Generator().manual_seed(1))
    layer.to(platform.device_type)
    for args in calls:
        torch._dynamo.reset()
        dims = {"first": 0, "second": 0, "third": 0}
        model = slotwise.compile(_OneCall(layer), config, dynamic_arg_dims=dims)
        for size in TRACED_SIZES:
            sized = tuple(a[:size].to(platform.device_type) for a in args)
            try:
                got = model(*sized)
            except (torch._dynamo.exc.TorchDynamoException, SizeSpecializationError) as exc:
                target.fail(
                    f"custom op {op_name!r} ({layer.implementation} implementation) does not "
                    f"compile at level 3, where the batch size is a symbol (first call: "
                    f"{TRACED_SIZES[0]} token): {type(exc).__name__}: {exc}. Python that "
                    "branches on a size, checks arguments or launches a kernel cannot be "
                    "traced: put the kernel behind a torch op (torch.library, with a "
                    "register_fake giving the output's shape), as slotwise_cuda does"
                )
            expected = layer.forward_native(*sized)
            try:
                torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=TOLERANCE)
            except AssertionError as exc:
                target.fail(
                    f"custom op {op_name!r} ({layer.implementation} implementation) compiled "
                    f"at level 3 differs from forward_native for {size} token(s): {exc}"
                )
    torch._dynamo.reset()
