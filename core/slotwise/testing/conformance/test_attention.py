"""Check ``attention``: the platform's attention backend agrees with the reference.

The backend is the one the platform selects for each layout, run the way models
run it: through the ``Attention`` layer and the unified attention op, with the
backend's own metadata builder and a cache of the backend's own shape.  Each batch
is preceded by a step that writes the requests' cached context through the backend
itself, so no assumption about the cache layout is needed; both steps are compared
with ``ReferenceAttention``.  Block tables are shuffled and the batch carries
padding rows past the real tokens, as a static-graph runner pads it.  A backend whose
``graph_support`` lets full graphs capture it is also run on the static metadata
layouts those graphs read (``StaticAttentionMetadata``), for the batches it declares.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from slotwise.attention import (
    Attention,
    AttentionBackend,
    AttentionBackendError,
    AttentionMetadataBuilder,
    StaticAttentionMetadata,
    allocate_kv_caches,
)
from slotwise.attention.selector import select_attention_backend
from slotwise.forward_context import set_forward_context
from slotwise.platforms import Platform
from slotwise.testing.conformance import target
from slotwise.testing.conformance.reference_attention import ReferenceAttention

#: (query_len, context_len) per request, decodes first as the metadata requires.
SCENARIOS = {
    "decode": [(1, 16), (1, 4), (1, 39), (1, 0)],
    "prefill": [(9, 0), (16, 0), (23, 0)],
    "chunked_prefill": [(7, 16), (12, 5), (5, 33)],
    "mixed": [(1, 20), (1, 8), (13, 0), (6, 11)],
}
#: (head_size, query heads per key/value head).
LAYOUTS = [(64, 1), (128, 2), (64, 4)]
NUM_KV_HEADS = 2
#: Tried in order; a backend that cannot serve one is asked for the next.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK_SIZES = (16, 128)
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}
PADDING = 2

_layer_names = itertools.count()


#: One request of a step: (query_len, context_len, block ids).
Request = tuple[int, int, list[int]]


@pytest.mark.parametrize("head_size, group", LAYOUTS, ids=lambda v: str(v))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_attention_matches_the_reference(scenario: str, head_size: int, group: int) -> None:
    run_scenario(scenario, head_size, group)


@pytest.mark.parametrize(
    "scenario, layout",
    [*((scenario, "general") for scenario in SCENARIOS), ("decode", "uniform_decode")],
)
def test_attention_on_the_full_graph_layouts_it_declares(scenario: str, layout: str) -> None:
    backend, _, _ = select_backend(target.platform(), 64)
    if not backend.graph_support.captures(uniform_decode_only=layout == "uniform_decode"):
        target.skip(
            f"{backend.get_name()} has graph_support {backend.graph_support.name}: full "
            f"graphs never capture it on the {layout} layout"
        )
    run_scenario(scenario, 64, 2, static_layout=layout)


def run_scenario(
    scenario: str, head_size: int, group: int, static_layout: str | None = None
) -> None:
    """The scenario's steps through the platform's backend, checked against the reference;
    ``static_layout`` ("general" or "uniform_decode") lays the last one out as a full
    graph reads it."""
    platform = target.platform()
    backend, dtype, block_size = select_backend(platform, head_size)
    generator = torch.Generator().manual_seed(len(scenario) * 1000 + head_size + group)
    num_heads = NUM_KV_HEADS * group
    scale = head_size**-0.5
    block_ids, num_blocks = shuffled_block_tables(SCENARIOS[scenario], block_size, generator)
    scratch_block = num_blocks  # for the padding requests of a static layout
    num_blocks += 1
    layer = Attention(
        num_heads,
        head_size,
        scale,
        NUM_KV_HEADS,
        prefix=f"slotwise_conformance.attention.{next(_layer_names)}",
        block_size=block_size,
        dtype=dtype,
        backend=backend,
    )
    device = platform.device_type
    allocate_kv_caches(layer, num_blocks, device=device, dtype=dtype)
    reference = ReferenceAttention(
        num_heads, NUM_KV_HEADS, head_size, scale, num_blocks=num_blocks, block_size=block_size
    )
    all_steps = steps(scenario, block_ids)
    for index, (label, batch) in enumerate(all_steps):
        lengths = ([q for q, _, _ in batch], [c for _, c, _ in batch], [b for _, _, b in batch])
        metadata = backend.get_builder_cls()(block_size, device).build(*lengths)
        num_tokens = metadata.num_actual_tokens
        if static_layout is not None and index == len(all_steps) - 1:
            label += f", on the static {static_layout} layout of a full graph"
            padded = num_tokens + PADDING
            static = StaticAttentionMetadata(padded, num_blocks, block_size, scratch_block, device)
            metadata = getattr(static, static_layout)(padded, metadata)
        q, k, v = (
            torch.randn(num_tokens + PADDING, heads, head_size, generator=generator).to(dtype)
            for heads in (num_heads, NUM_KV_HEADS, NUM_KV_HEADS)
        )
        try:
            with set_forward_context(metadata):
                out = layer(*(x.flatten(1).to(device) for x in (q, k, v)))
        except Exception as exc:  # noqa: BLE001 - reported with the step that raised it
            target.fail(
                f"attention backend {backend.get_name()} raised {type(exc).__name__} on "
                f"{label}: {exc}"
            )
        expected = reference.step(q, k, v, AttentionMetadataBuilder(block_size).build(*lengths))
        got = out[:num_tokens].view(num_tokens, num_heads, head_size).double().cpu()
        what = f"{label} (query+context lengths {', '.join(f'{q}+{c}' for q, c, _ in batch)})"
        compare(
            got,
            expected,
            backend,
            dtype,
            f"{what}, head size {head_size}, {num_heads} query heads over {NUM_KV_HEADS} "
            "key/value heads",
        )
        if not bool(out[num_tokens:].isfinite().all()):
            target.fail(
                f"attention backend {backend.get_name()} wrote non-finite values into the "
                f"padding rows of {label}; padding requests decode one token on a scratch "
                "block and must give finite rows, or they spread NaN through later layers"
            )


def steps(scenario: str, block_ids: list[list[int]]) -> list[tuple[str, list[Request]]]:
    """The scenario's batch, preceded by a step writing the requests' cached context
    (a prefill of it; a 1-token context is a decode, ordered first)."""
    requests = [(q, c, b) for (q, c), b in zip(SCENARIOS[scenario], block_ids, strict=True)]
    context = sorted(((c, 0, b) for _, c, b in requests if c), key=lambda r: r[0] != 1)
    batches = [("the step writing the cached context", context)] if context else []
    return [*batches, (f"the {scenario} batch", requests)]


def select_backend(
    platform: Platform, head_size: int
) -> tuple[type[AttentionBackend], torch.dtype, int]:
    """The backend the platform picks, with the first dtype and block size it serves."""
    refusals = []
    for dtype, block_size in itertools.product(DTYPES, BLOCK_SIZES):
        try:
            backend = select_attention_backend(
                platform, head_size=head_size, dtype=dtype, block_size=block_size
            )
        except AttentionBackendError as exc:
            refusals.append(f"{dtype} with block size {block_size}: {exc}")
        else:
            return backend, dtype, block_size
    target.fail(f"no attention backend for head size {head_size}: " + "; ".join(refusals))


def shuffled_block_tables(
    requests: list[tuple[int, int]], block_size: int, generator: torch.Generator
) -> tuple[list[list[int]], int]:
    """Non-contiguous blocks for each request, and the cache size (with spare blocks)."""
    needed = [-(-(q + c) // block_size) for q, c in requests]
    num_blocks = sum(needed) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    starts = itertools.accumulate(needed, initial=0)
    return [order[start : start + n] for start, n in zip(starts, needed, strict=False)], num_blocks


def compare(
    got: torch.Tensor,
    expected: torch.Tensor,
    backend: type[AttentionBackend],
    dtype: torch.dtype,
    what: str,
) -> None:
    """Fail with the worst token and its error when ``got`` is not close to ``expected``."""
    tolerance = TOLERANCE[dtype]
    error = (got - expected).abs()
    allowed = tolerance + tolerance * expected.abs()
    if bool((error <= allowed).all()) and bool(torch.isfinite(got).all()):
        return
    worst = int(torch.nan_to_num(error - allowed, nan=float("inf")).amax(dim=(1, 2)).argmax())
    target.fail(
        f"attention backend {backend.get_name()} ({dtype}) differs from the reference on "
        f"{what}: max |error| {float(error.max()):.3g} (tolerance {tolerance:g} + "
        f"{tolerance:g} x |expected|), worst at token {worst}: got "
        f"{_head(got[worst])} ..., expected {_head(expected[worst])} ..."
    )


def _head(token: torch.Tensor) -> str:
    """The first values of a token's first head, short enough for a failure message."""
    return "[" + ", ".join(f"{value:.4f}" for value in token[0, :4].tolist()) + "]"
