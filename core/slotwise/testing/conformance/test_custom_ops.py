"""Check ``custom_ops``: what the platform runs for each core custom op equals ``forward_native``.

A layer picks its implementation once, at construction: a replacement a plugin
registered for this platform (hook ``slotwise_register_custom_ops``), else the
class's ``forward_<custom_op_key>``, else ``forward_native``.  The layers are
built at compilation level 0, where every custom op is enabled, so what runs is
the platform's own code; a registered replacement must actually be the one chosen.

Each op runs in float32, bfloat16 and float16 (a kernel's half-precision path is
code of its own), on ordinary inputs and, for the norm and the activation, on
small-magnitude ones (1e-4: where RMSNorm's eps dominates the mean square).  Its
output must have ``forward_native``'s dtype, shape and device, and be within
``tolerance.reduction_bound`` of ``forward_native`` computed in float64 on the same
inputs.  The ops that run inside compiled models are then compiled as level 3
compiles a model, with the batch size a symbol, and called with 1, then more, tokens.
"""

from __future__ import annotations

import copy
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
from slotwise.testing.conformance.tolerance import reduction_bound

NUM_TOKENS = 7
HIDDEN = 64
HEAD_SIZE = 64
MAX_POSITION = 128
VOCAB = 256
#: The compiled op against its own forward_native, both float32.
TOLERANCE = 1e-4
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Small-magnitude inputs: RMSNorm's mean square (1e-8) is then well below its eps (1e-6).
SMALL = 1e-4
#: In the label of the calls on small-magnitude inputs, which the level-3 check skips.
SMALL_LABEL = f"of magnitude {SMALL:g}"

#: One call of an op: what it is (for messages) and its arguments.
Call = tuple[str, tuple[Any, ...]]


def rms_norm(generator: torch.Generator) -> tuple[CustomOp, list[Call]]:
    layer = RMSNorm(HIDDEN)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(HIDDEN, generator=generator))
    x, residual = torch.randn(2, NUM_TOKENS, HIDDEN, generator=generator)
    return layer, [
        ("x", (x,)),
        ("x and a residual", (x, residual)),
        (f"x {SMALL_LABEL}", (x * SMALL,)),
        (f"x and a residual {SMALL_LABEL}", (x * SMALL, residual * SMALL)),
    ]


def silu_and_mul(generator: torch.Generator) -> tuple[CustomOp, list[Call]]:
    x = torch.randn(NUM_TOKENS, 2 * HIDDEN, generator=generator)
    return SiluAndMul(), [("x", (x,)), (f"x {SMALL_LABEL}", (x * SMALL,))]


def rotary_embedding(generator: torch.Generator) -> tuple[CustomOp, list[Call]]:
    layer = RotaryEmbedding(HEAD_SIZE, MAX_POSITION)
    positions = torch.randint(MAX_POSITION, (NUM_TOKENS,), generator=generator)
    query = torch.randn(NUM_TOKENS, 4 * HEAD_SIZE, generator=generator)
    key = torch.randn(NUM_TOKENS, 2 * HEAD_SIZE, generator=generator)
    return layer, [("positions, query and key", (positions, query, key))]


def logits(generator: torch.Generator) -> tuple[CustomOp, list[Call]]:
    lm_head = ParallelLMHead(VOCAB, HIDDEN)
    with torch.no_grad():
        lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator))
    rows = [torch.randn(n, HIDDEN, generator=generator) for n in (1, 3, NUM_TOKENS)]
    return LogitsHead(), [(f"{len(hidden)} hidden rows", (lm_head, hidden)) for hidden in rows]


#: Each core op by name: builds the layer (on the CPU) and the calls to make.
BUILDERS: dict[str, Callable[[torch.Generator], tuple[CustomOp, list[Call]]]] = {
    "rms_norm": rms_norm,
    "silu_and_mul": silu_and_mul,
    "rotary_embedding": rotary_embedding,
    "logits": logits,
}
#: The length of the reduction behind each output element, for its error bound.
REDUCTION_LENGTHS = {"rms_norm": HIDDEN, "silu_and_mul": 1, "rotary_embedding": 2, "logits": HIDDEN}


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
@pytest.mark.parametrize("op_name", BUILDERS)
def test_custom_op_matches_forward_native(op_name: str, dtype: torch.dtype) -> None:
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
    layer.to(device=device, dtype=dtype)
    reference = copy.deepcopy(layer).to(device="cpu", dtype=torch.float64)
    for label, cpu_args in calls:
        args = tuple(_on(a, device, dtype) for a in cpu_args)
        what = (
            f"custom op {op_name!r} ({layer.implementation} implementation) on {label} in {dtype}"
        )
        try:
            got = layer(*(_copy(a) for a in args))
        except Exception as exc:  # noqa: BLE001 - reported with the call that raised it
            target.fail(f"{what} raised {type(exc).__name__}: {exc}")
        native = layer.forward_native(*(_copy(a) for a in args))
        expected = reference.forward_native(*(_on(a, "cpu", torch.float64) for a in args))
        for index, (out, like, exact) in enumerate(_outputs(got, native, expected, what)):
            output = f"{what}, output {index}" if isinstance(native, tuple) else what
            target.expect_tensor(
                output, out, dtype=like.dtype, shape=tuple(like.shape), device=like.device
            )
            compare(output, out, exact, dtype, REDUCTION_LENGTHS[op_name])


def compare(
    what: str, got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, reduction: int
) -> None:
    """Fail, naming the worst element, unless ``got`` is within the bound of ``expected``
    (float64) for ``dtype`` and a reduction of length ``reduction``."""
    expected = expected.double()
    row_scale = expected.square().mean(dim=-1, keepdim=True).sqrt()
    allowed = reduction_bound(expected, row_scale, dtype, reduction)
    got = target.host(got).double()
    error = (got - expected).abs()
    if bool((error <= allowed).all()):
        return
    ratio = torch.nan_to_num(error / allowed, nan=float("inf"))
    worst = tuple(int(i) for i in torch.unravel_index(ratio.argmax(), ratio.shape))
    target.fail(
        f"{what} differs from forward_native computed in float64: at {list(worst)} got "
        f"{float(got[worst]):.6g}, expected {float(expected[worst]):.6g}, an error "
        f"{float(ratio[worst]):.3g} times what {dtype}'s precision allows there "
        f"({float(allowed[worst]):.3g}, see slotwise.testing.conformance.tolerance); "
        f"max |error| {float(error.max()):.3g}"
    )


def _outputs(
    got: Any, native: Any, expected: Any, what: str
) -> list[tuple[Any, torch.Tensor, torch.Tensor]]:
    """(output, forward_native's output, the float64 one) for each tensor an op returns."""
    if not isinstance(native, tuple):
        return [(got, native, expected)]
    if not isinstance(got, tuple) or len(got) != len(native):
        target.fail(f"{what} returned {type(got).__name__}, expected a tuple of {len(native)}")
    return list(zip(got, native, expected, strict=True))


def _on(value: Any, device: str, dtype: torch.dtype) -> Any:
    """``value`` on ``device``, floating tensors and modules in ``dtype``."""
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(device=device, dtype=dtype)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(device=device, dtype=dtype)
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def _on_host(value: Any) -> Any:
    """An op's output (a tensor or a tuple of them) on the host, where it is compared."""
    if isinstance(value, tuple):
        return tuple(_on_host(item) for item in value)
    return target.host(value) if isinstance(value, torch.Tensor) else value


def _copy(value: Any) -> Any:
    """A fresh copy of a tensor argument, so that an op writing into its inputs cannot
    change what the next call sees."""
    return value.clone() if isinstance(value, torch.Tensor) else value


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
    for label, args in calls:
        if SMALL_LABEL in label:  # a question of values, answered in eager mode above
            continue
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
                torch.testing.assert_close(
                    _on_host(got), _on_host(expected), atol=TOLERANCE, rtol=TOLERANCE
                )
            except AssertionError as exc:
                target.fail(
                    f"custom op {op_name!r} ({layer.implementation} implementation) compiled "
                    f"at level 3 differs from forward_native for {size} token(s): {exc}"
                )
    torch._dynamo.reset()
