"""Every bundled backend against the one oracle, through the Attention layer and the op.

Every bundled plugin by design: one harness holds all the backends users install to
the same cases and the same tolerance, so they agree with each other as well as with
the oracle.  The backends are reached as discovery reaches them, by platform and name
through the plugins' entry points, never through their modules.

Each case fills a cache whose block tables are shuffled, writes the cached context
by hand, runs one step (with two padding rows past the real tokens) and checks the
output against the conformance kit's ``causal_attention`` and the cache against the
tokens written.
Backends that may be captured in full graphs are also run on the metadata layouts of
``StaticAttentionMetadata``, where the padding rows are requests on a scratch block.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from slotwise.attention import (
    Attention,
    AttentionBackend,
    GraphSupport,
    StaticAttentionMetadata,
    select_attention_backend,
)
from slotwise.forward_context import set_forward_context
from slotwise.testing.conformance.reference_attention import causal_attention
from slotwise.testing.triton_interpreter import (
    ON_GPU,
    helpers_interpreted,
    import_interpreted,
    interpreting,
)

#: The bundled backends, each as its platform's registry gives it.
CPU_SDPA = select_attention_backend("cpu", "CPU_SDPA")
TRITON_PAGED = select_attention_backend("cuda", "TRITON_PAGED")
ASCEND_STUB_REFERENCE = select_attention_backend("ascend_stub", "ASCEND_STUB_REFERENCE")

#: (query_len, context_len) per request, decodes first.
SCENARIOS = {
    "decode": [(1, 16), (1, 4), (1, 39), (1, 0)],
    "prefill": [(9, 0), (16, 0), (23, 0)],
    "chunked_prefill": [(7, 16), (12, 5), (5, 33)],
    "mixed": [(1, 20), (1, 8), (13, 0), (6, 11)],
}
HEAD_SIZES = (64, 128, 80)
GQA_RATIOS = (1, 2, 4)
BLOCK_SIZES = (8, 16)
NUM_KV_HEADS = 2
PADDING = 2

#: Backends whose blocks are head-major, [2, blocks, kv heads, block size, D]; the others
#: keep the core's default shape, [2, blocks, block size, kv heads, D].
HEAD_MAJOR = (CPU_SDPA,)

FULL_MATRIX = list(itertools.product(SCENARIOS, HEAD_SIZES, GQA_RATIOS, BLOCK_SIZES))
KERNELS_MODULE = "slotwise_cuda.kernels.attention"

_names = itertools.count()


@dataclass
class Step:
    queries: list[torch.Tensor]  # per request [query_len, num_heads, head_size]
    keys: list[torch.Tensor]  # per request [seq_len, num_kv_heads, head_size]
    values: list[torch.Tensor]
    block_ids: list[list[int]]


def make_step(
    requests: list[tuple[int, int]], num_heads: int, head_size: int, block_size: int, seed: int
) -> tuple[Step, int]:
    """Random tokens and shuffled, non-contiguous block tables; returns the step and
    the number of blocks the cache needs."""
    generator = torch.Generator().manual_seed(seed)
    needed = [-(-(q + c) // block_size) for q, c in requests]
    num_blocks = sum(needed) + 3  # spare blocks that must stay untouched
    order = torch.randperm(num_blocks, generator=generator).tolist()
    block_ids, start = [], 0
    for count in needed:
        block_ids.append(order[start : start + count])
        start += count

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    step = Step(
        queries=[randn(q, num_heads, head_size) for q, _ in requests],
        keys=[randn(q + c, NUM_KV_HEADS, head_size) for q, c in requests],
        values=[randn(q + c, NUM_KV_HEADS, head_size) for q, c in requests],
        block_ids=block_ids,
    )
    return step, num_blocks


def cache_position(step: Step, r: int, pos: int, block_size: int) -> tuple[int, int]:
    return step.block_ids[r][pos // block_size], pos % block_size


def run_case(
    backend: type[AttentionBackend],
    scenario: str,
    head_size: int,
    ratio: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    atol: float = 2e-4,
    static_layout: str | None = None,
) -> None:
    """``static_layout``: "uniform_decode" or "general" runs the step on that layout of
    static metadata padded by PADDING tokens, as a full graph would."""
    requests = SCENARIOS[scenario]
    num_heads = NUM_KV_HEADS * ratio
    scale = head_size**-0.5
    seed = hash((scenario, head_size, ratio, block_size)) % 2**31
    step, num_blocks = make_step(requests, num_heads, head_size, block_size, seed)
    scratch_block = num_blocks  # one more block, for the static layout's padding requests
    num_blocks += 1
    shape = backend.get_kv_cache_shape(num_blocks, block_size, NUM_KV_HEADS, head_size)
    if backend in HEAD_MAJOR:
        assert shape == (2, num_blocks, NUM_KV_HEADS, block_size, head_size)
    else:
        assert shape == (2, num_blocks, block_size, NUM_KV_HEADS, head_size)
    kv_cache = torch.zeros(shape, dtype=dtype, device=device)
    # [2, blocks, block size, kv heads, D] whichever the layout
    tokens = kv_cache.transpose(2, 3) if backend in HEAD_MAJOR else kv_cache
    for r, (_, context_len) in enumerate(requests):
        for pos in range(context_len):
            block, offset = cache_position(step, r, pos, block_size)
            tokens[0, block, offset] = step.keys[r][pos]
            tokens[1, block, offset] = step.values[r][pos]

    layer = Attention(
        num_heads,
        head_size,
        scale,
        NUM_KV_HEADS,
        prefix=f"oracle.{next(_names)}",
        block_size=block_size,
        dtype=dtype,
        backend=backend,
    )
    layer.kv_cache = kv_cache
    metadata = backend.get_builder_cls()(block_size, device).build(
        [q for q, _ in requests], [c for _, c in requests], step.block_ids
    )
    num_tokens = metadata.num_actual_tokens
    if static_layout is not None:
        static = StaticAttentionMetadata(
            num_tokens + PADDING, num_blocks, block_size, scratch_block, device
        )
        metadata = getattr(static, static_layout)(num_tokens + PADDING, metadata)

    def batch(parts: list[torch.Tensor], heads: int) -> torch.Tensor:
        rows = torch.cat([*parts, torch.randn(PADDING, heads, head_size)])
        return rows.reshape(len(rows), heads * head_size).to(device, dtype)

    new_keys = [k[c:] for k, (_, c) in zip(step.keys, requests, strict=True)]
    new_values = [v[c:] for v, (_, c) in zip(step.values, requests, strict=True)]
    # q, k and v are column slices of one fused buffer, as a model's qkv projection gives.
    qkv = torch.cat(
        [
            batch(step.queries, num_heads),
            batch(new_keys, NUM_KV_HEADS),
            batch(new_values, NUM_KV_HEADS),
        ],
        dim=1,
    )
    q_size, kv_size = num_heads * head_size, NUM_KV_HEADS * head_size
    with set_forward_context(metadata):
        out = layer(*qkv.split([q_size, kv_size, kv_size], dim=1))

    assert out.shape == (num_tokens + PADDING, num_heads * head_size)
    expected = torch.cat(
        [
            causal_attention(q.to(dtype), k.to(dtype), v.to(dtype), scale)
            for q, k, v in zip(step.queries, step.keys, step.values, strict=True)
        ]
    )
    got = out[:num_tokens].view(num_tokens, num_heads, head_size).double().cpu()
    torch.testing.assert_close(got, expected, atol=atol, rtol=atol)
    if static_layout is None:
        assert not out[num_tokens:].any(), "padding rows must be zero"
    else:
        assert out[num_tokens:].isfinite().all(), "padding requests must compute finite rows"

    used = torch.zeros(num_blocks, dtype=torch.bool)
    used[scratch_block] = static_layout is not None
    for r, (query_len, context_len) in enumerate(requests):
        used[step.block_ids[r]] = True
        for pos in range(query_len + context_len):
            block, offset = cache_position(step, r, pos, block_size)
            cached_key = tokens[0, block, offset].cpu()
            cached_value = tokens[1, block, offset].cpu()
            assert torch.equal(cached_key, step.keys[r][pos].to(dtype)), (r, pos)
            assert torch.equal(cached_value, step.values[r][pos].to(dtype)), (r, pos)
    assert not kv_cache[:, ~used.to(device)].any(), "spare blocks were written"


@pytest.mark.parametrize("scenario, head_size, ratio, block_size", FULL_MATRIX)
@pytest.mark.parametrize(
    "backend", [CPU_SDPA, ASCEND_STUB_REFERENCE], ids=lambda backend: backend.get_name()
)
def test_cpu_backends_match_the_reference(backend, scenario, head_size, ratio, block_size):
    run_case(backend, scenario, head_size, ratio, block_size)


@pytest.mark.parametrize(
    "backend", [CPU_SDPA, ASCEND_STUB_REFERENCE], ids=lambda backend: backend.get_name()
)
def test_cpu_backends_in_bfloat16(backend):
    run_case(backend, "mixed", 64, 2, 16, dtype=torch.bfloat16, atol=3e-2)


@pytest.fixture(scope="module")
def triton_device() -> Iterator[str]:
    """The device the Triton kernels run on; skips only when they are not written yet."""
    if importlib.util.find_spec("slotwise_cuda.kernels") is None or (
        importlib.util.find_spec(KERNELS_MODULE) is None
    ):
        pytest.skip(f"{KERNELS_MODULE} does not exist yet: the Triton kernels are not written")
    if ON_GPU:
        importlib.import_module(KERNELS_MODULE)
        yield "cuda"
        return
    if not helpers_interpreted():
        pytest.fail(
            "triton.language was imported without TRITON_INTERPRET=1 before this module; "
            "run with TRITON_INTERPRET=1 exported"
        )
    import_interpreted(KERNELS_MODULE)
    with interpreting():
        yield "cpu"


@pytest.mark.parametrize("scenario, head_size, ratio, block_size", FULL_MATRIX)
def test_triton_backend_matches_the_reference(
    triton_device, scenario, head_size, ratio, block_size
):
    run_case(TRITON_PAGED, scenario, head_size, ratio, block_size, device=triton_device)


def full_graph_cases(backends: list[type[AttentionBackend]]) -> list[tuple]:
    """(backend, scenario, layout) for every layout a backend's graph_support captures."""
    cases = []
    for backend in backends:
        if backend.graph_support.captures(uniform_decode_only=False):
            cases += [(backend, scenario, "general") for scenario in SCENARIOS]
        if backend.graph_support.captures(uniform_decode_only=True):
            cases.append((backend, "decode", "uniform_decode"))
    return cases


@pytest.mark.parametrize(
    "backend, scenario, layout", full_graph_cases([CPU_SDPA, ASCEND_STUB_REFERENCE])
)
def test_cpu_backends_on_full_graph_layouts(backend, scenario, layout):
    run_case(backend, scenario, 64, 2, 8, static_layout=layout)


@pytest.mark.parametrize("scenario, layout", [c[1:] for c in full_graph_cases([TRITON_PAGED])])
@pytest.mark.parametrize("head_size, ratio, block_size", [(64, 2, 16), (80, 4, 8)])
def test_triton_backend_on_full_graph_layouts(
    triton_device, scenario, layout, head_size, ratio, block_size
):
    run_case(
        TRITON_PAGED,
        scenario,
        head_size,
        ratio,
        block_size,
        device=triton_device,
        static_layout=layout,
    )


def test_bundled_graph_backends_may_be_captured_in_full_graphs():
    # The layouts above are only run for what a backend declares.
    assert TRITON_PAGED.graph_support is GraphSupport.ALWAYS
    assert ASCEND_STUB_REFERENCE.graph_support is GraphSupport.UNIFORM_DECODE


@pytest.mark.cuda
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_backend_in_half_precision_on_the_gpu(triton_device, dtype):
    run_case(TRITON_PAGED, "mixed", 128, 4, 16, dtype=dtype, device=triton_device, atol=2e-2)
