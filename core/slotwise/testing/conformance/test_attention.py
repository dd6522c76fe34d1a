"""Check ``attention``: the platform's attention backend agrees with the reference.

The backend is the one the platform selects for each layout, run the way models
run it: through the ``Attention`` layer and the unified attention op, with the
backend's own metadata builder and a cache of the backend's own shape.  Each batch
is preceded by a step that writes the requests' cached context through the backend
itself, so no assumption about the cache layout is needed; both steps are compared
with ``ReferenceAttention``.  Block tables are shuffled and the batch carries
padding rows past the real tokens, as a static-graph runner pads it.

Every layout uses a scale other than 1/sqrt(head_size), so a backend ignoring the
layer's scale fails, and several query heads per key/value head, so a backend pairing
query heads with the wrong key/value head fails; the scenarios put cached prefixes,
queries and decodes on and across block boundaries, where a causal mask that is not
offset by the cached context shows.  A failure names the worst element (token,
request, position, head, dim) with enough digits to see it differ.  The output is
checked on a host copy (padding rows included), never with ops of the kit's own on
the device.

Every dtype the backend serves is checked, each against a bound derived from its
precision and the reduction lengths (``tolerance.attention_bound``), on the scenarios
above, on a long context (thousands of cached tokens, where a kernel accumulating in
bfloat16 drifts) and on inputs of a wide dynamic range (peaked scores and values
spanning 2^-8 to 2^8, where scores rounded to the dtype or a softmax without its
running maximum go wrong).  The output's dtype, shape and device are checked first.

A backend whose ``graph_support`` lets full graphs capture it is also captured, on the
static metadata layouts those graphs read (``StaticAttentionMetadata``), as a recorded
graph, then replayed on new data copied into the same buffers, as a runner does.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from slotwise.attention import (
    Attention,
    AttentionBackend,
    AttentionBackendError,
    AttentionMetadata,
    AttentionMetadataBuilder,
    StaticAttentionMetadata,
    allocate_kv_caches,
)
from slotwise.attention.selector import select_attention_backend
from slotwise.compilation import StaticGraphError
from slotwise.compilation.static_graphs.recorded_graph import RecordedGraphAPI
from slotwise.forward_context import set_forward_context
from slotwise.platforms import Platform
from slotwise.testing.conformance import target
from slotwise.testing.conformance.reference_attention import AttentionTerms, ReferenceAttention
from slotwise.testing.conformance.tolerance import attention_bound

#: (query_len, context_len) per request for a block size, decodes first as the metadata
#: requires.  Lengths that matter relative to blocks are written in blocks.
SCENARIOS: dict[str, Callable[[int], list[tuple[int, int]]]] = {
    "decode": lambda block: [(1, 16), (1, 4), (1, 39), (1, 0)],
    "prefill": lambda block: [(9, 0), (16, 0), (23, 0)],
    "chunked_prefill": lambda block: [(7, 16), (12, 5), (5, 33)],
    "mixed": lambda block: [(1, 20), (1, 8), (13, 0), (6, 11)],
    # The new token opening a block (after one or two whole blocks), closing one, or first.
    "decode_on_block_boundaries": lambda block: [
        (1, block),
        (1, 2 * block),
        (1, block - 1),
        (1, 0),
    ],
    # Where a causal mask aligned top-left instead of bottom-right shows: queries short
    # and longer than a block after a long prefix, and prefixes ending on a block.
    "cached_prefix": lambda block: [
        (2, 3 * block + 5),
        (block + 7, 3 * block + 5),
        (9, 2 * block),
        (block + 1, block),
    ],
    # Prefills of exactly a block, of one token more, and of two tokens.
    "prefill_on_block_boundaries": lambda block: [(2, 0), (block, 0), (block + 1, 0)],
}
#: The scenarios a uniform-decode full graph serves.
DECODE_SCENARIOS = ("decode", "decode_on_block_boundaries")
#: (head_size, query heads per key/value head, scale in units of 1/sqrt(head_size)).
#: Two scales per head size: a backend must use the layer's, not one of its own.
LAYOUTS = [(64, 1, 0.75), (128, 2, 1.25), (64, 4, 1.25), (64, 8, 0.75)]
#: The layout of the full-graph checks.
FULL_GRAPH_LAYOUT = (64, 2, 0.75)
#: Two layers of one layout but different scales, sharing each step as a model's do.
SHARED_STEP_LAYOUTS = [(64, 2, 0.75), (64, 2, 1.25)]
NUM_KV_HEADS = 2
#: Each is checked where the backend serves it; the full-graph checks use the first served.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Tried in order for each dtype; a backend that cannot serve one is asked for the next.
BLOCK_SIZES = (16, 128)
PADDING = 2
#: Tokens of the long-context request: long enough that bfloat16 running sums drift
#: past the bound, short enough for a float64 reference in a fraction of a second.
LONG_CONTEXT = 4096
#: The long context is written through the backend in chunked prefills of this size.
CONTEXT_CHUNK = 512
#: Query tokens of the chunk after the long context; a decode follows it.
LONG_CONTEXT_QUERY = 16
LONG_CONTEXT_LAYOUT = (64, 2, 1.25)
#: Wide dynamic range: queries this many times larger (scores up to about +-20, so the
#: softmax is peaked), values spread over 2^-VALUE_OCTAVES to 2^VALUE_OCTAVES per token.
QUERY_GAIN = 4.0
VALUE_OCTAVES = 8
WIDE_RANGE_REQUESTS = [(1, 500), (1, 33), (24, 200), (48, 0)]
WIDE_RANGE_LAYOUT = (64, 2, 1.25)

_layer_names = itertools.count()


#: One request of a step: (query_len, context_len, block ids).
Request = tuple[int, int, list[int]]


_DTYPE_IDS = [str(dtype).removeprefix("torch.") for dtype in DTYPES]
#: float32 runs every layout; the half dtypes, whose code paths differ in precision, not
#: in how heads or masks are laid out, run this one.
HALF_PRECISION_LAYOUT = (128, 2, 1.25)
#: (dtype, head size, query heads per key/value head, scale factor) of the scenario tests.
DTYPE_LAYOUTS = [
    *((torch.float32, *layout) for layout in LAYOUTS),
    *((dtype, *HALF_PRECISION_LAYOUT) for dtype in DTYPES if dtype != torch.float32),
]


@pytest.mark.parametrize(
    "dtype, head_size, group, scale_factor",
    DTYPE_LAYOUTS,
    ids=lambda v: str(v).removeprefix("torch."),
)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_attention_matches_the_reference(
    scenario: str, head_size: int, group: int, scale_factor: float, dtype: torch.dtype
) -> None:
    case = Case.prepare(scenario, head_size, group, scale_factor, dtype=dtype)
    for label, batch in case.steps:
        case.run_step(label, batch)


@pytest.mark.parametrize("dtype", DTYPES, ids=_DTYPE_IDS)
def test_attention_on_a_long_context(dtype: torch.dtype) -> None:
    """A chunk of queries after thousands of cached tokens, then a decode after them all."""
    context_len = LONG_CONTEXT - LONG_CONTEXT_QUERY - 1
    case = Case.prepare(
        "long_context",
        *LONG_CONTEXT_LAYOUT,
        dtype=dtype,
        requests=[(LONG_CONTEXT_QUERY, context_len)],
    )
    *context_steps, (label, batch) = case.steps
    for _, context_batch in context_steps:
        case.fill_context(context_batch)
    case.run_step(label, batch)
    ((_, _, blocks),) = batch  # they hold LONG_CONTEXT positions, the decode's included
    case.run_step("the decode after it", [(1, context_len + LONG_CONTEXT_QUERY, blocks)])


@pytest.mark.parametrize("dtype", DTYPES, ids=_DTYPE_IDS)
def test_attention_on_a_wide_dynamic_range(dtype: torch.dtype) -> None:
    case = Case.prepare(
        "wide_dynamic_range", *WIDE_RANGE_LAYOUT, dtype=dtype, requests=WIDE_RANGE_REQUESTS
    )
    case.wide_range = True
    for label, batch in case.steps:
        case.run_step(label, batch)


def test_layers_sharing_a_step_each_match_the_reference() -> None:
    """A model's layers all run on one step's metadata, in which a backend may keep what
    it works out once per step (``AttentionMetadata.step_cache``): each layer must still
    get the answer of its own cache and scale."""
    first, second = (Case.prepare("mixed", *layout) for layout in SHARED_STEP_LAYOUTS)
    for label, batch in first.steps:
        metadata = first.build_metadata(batch)
        for layer, case in enumerate((first, second)):
            case.run_step(f"{label}, layer {layer} of 2 sharing the step", batch, metadata=metadata)


@pytest.mark.parametrize(
    "scenario, layout",
    [
        *((scenario, "general") for scenario in SCENARIOS),
        *((scenario, "uniform_decode") for scenario in DECODE_SCENARIOS),
    ],
)
def test_attention_on_the_full_graph_layouts_it_declares(scenario: str, layout: str) -> None:
    backend, _, _ = select_first_backend(target.platform(), FULL_GRAPH_LAYOUT[0])
    if not backend.graph_support.captures(uniform_decode_only=layout == "uniform_decode"):
        target.skip(
            f"{backend.get_name()} has graph_support {backend.graph_support.name}: full "
            f"graphs never capture it on the {layout} layout"
        )
    case = Case.prepare(scenario, *FULL_GRAPH_LAYOUT)
    *context_steps, (label, batch) = case.steps
    for context_label, context_batch in context_steps:
        case.run_step(context_label, context_batch)
    case.run_step(label, batch, static_layout=layout)


@dataclass
class Case:
    """One scenario on one layout: the platform's layer and the reference, fed the same
    steps."""

    backend: type[AttentionBackend]
    dtype: torch.dtype
    block_size: int
    device: torch.device
    layer: Attention
    reference: ReferenceAttention
    steps: list[tuple[str, list[Request]]]
    num_blocks: int
    scratch_block: int  # for the padding requests of a static layout
    generator: torch.Generator
    #: Head size, scale and heads, for failure messages.
    description: str
    #: Whether q/k/v are drawn with a wide dynamic range (see the module's docstring).
    wide_range: bool = False

    @classmethod
    def prepare(
        cls,
        scenario: str,
        head_size: int,
        group: int,
        scale_factor: float,
        *,
        dtype: torch.dtype | None = None,
        requests: list[tuple[int, int]] | None = None,
    ) -> Case:
        """The case on the backend the platform selects for ``dtype`` (default: the first
        of DTYPES it serves); ``requests`` replaces the scenario's own batch."""
        platform = target.platform()
        if dtype is None:
            backend, dtype, block_size = select_first_backend(platform, head_size)
        else:
            backend, block_size = select_backend(platform, head_size, dtype)
        seed = zlib.crc32(f"{scenario}/{head_size}/{group}/{scale_factor}/{dtype}".encode())
        generator = torch.Generator().manual_seed(seed)
        num_heads = NUM_KV_HEADS * group
        scale = scale_factor * head_size**-0.5
        if requests is None:
            requests = SCENARIOS[scenario](block_size)
        block_ids, num_blocks = shuffled_block_tables(requests, block_size, generator)
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
        device = torch.device(platform.device_type)
        allocate_kv_caches(layer, num_blocks + 1, device=device, dtype=dtype)
        reference = ReferenceAttention(
            num_heads,
            NUM_KV_HEADS,
            head_size,
            scale,
            num_blocks=num_blocks + 1,
            block_size=block_size,
        )
        return cls(
            backend=backend,
            dtype=dtype,
            block_size=block_size,
            device=device,
            layer=layer,
            reference=reference,
            steps=scenario_steps(scenario, requests, block_ids, chunk=CONTEXT_CHUNK),
            num_blocks=num_blocks + 1,
            scratch_block=num_blocks,
            generator=generator,
            description=(
                f"head size {head_size}, scale {scale:.6g} ({scale_factor:g}/sqrt({head_size})), "
                f"{num_heads} query heads over {NUM_KV_HEADS} key/value heads"
            ),
        )

    def build_metadata(self, batch: list[Request]) -> AttentionMetadata:
        """The step's metadata, as the backend's builder makes it."""
        builder = self.backend.get_builder_cls()(self.block_size, self.device)
        return builder.build(*step_lengths(batch))

    def run_step(
        self,
        label: str,
        batch: list[Request],
        static_layout: str | None = None,
        metadata: AttentionMetadata | None = None,
    ) -> None:
        """Run one step through the platform's backend and check it against the reference;
        ``static_layout`` ("general" or "uniform_decode") captures the step as a full
        graph reads it and replays it on this step's data; ``metadata``: the step's, built
        for another layer already."""
        lengths = step_lengths(batch)
        if metadata is None:
            metadata = self.build_metadata(batch)
        num_tokens = metadata.num_actual_tokens
        q, k, v = self.random_qkv(num_tokens + PADDING)
        if static_layout is None:
            out = self.run_eagerly(label, metadata, q, k, v)
        else:
            label += f", replayed in a full graph on the static {static_layout} layout"
            out = self.replay_in_full_graph(label, static_layout, metadata, q, k, v)
        what = f"{label} (query+context lengths {', '.join(f'{q}+{c}' for q, c, _ in batch)})"
        layer = self.layer
        target.expect_tensor(
            f"the output of attention backend {self.backend.get_name()} on {what}",
            out,
            dtype=self.dtype,
            shape=(num_tokens + PADDING, layer.num_heads * layer.head_size),
            device=self.device,
        )
        expected = self.reference.step_terms(
            q, k, v, AttentionMetadataBuilder(self.block_size, "cpu").build(*lengths)
        )
        on_host = target.host(out)
        got = on_host[:num_tokens].view(expected.out.shape).double()
        self.compare(got, expected, batch, f"{what}, {self.description}")
        if not bool(on_host[num_tokens:].isfinite().all()):
            target.fail(
                f"attention backend {self.backend.get_name()} wrote non-finite values into the "
                f"padding rows of {label}; padding requests decode one token on a scratch "
                "block and must give finite rows, or they spread NaN through later layers"
            )

    def fill_context(self, batch: list[Request]) -> None:
        """Write a step's keys and values through the backend, and into the reference's
        cache, without comparing its output (the long context's many prefill chunks)."""
        lengths = step_lengths(batch)
        metadata = self.build_metadata(batch)
        q, k, v = self.random_qkv(metadata.num_actual_tokens)
        chunk = ", ".join(f"{q}+{c}" for q, c, _ in batch)
        self.run_eagerly(f"a step writing the long context ({chunk})", metadata, q, k, v)
        self.reference.store(k, v, AttentionMetadataBuilder(self.block_size, "cpu").build(*lengths))

    def random_qkv(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of a step, on the CPU in the case's dtype; every head distinct."""
        layer = self.layer
        q, k, v = (
            torch.randn(num_tokens, heads, layer.head_size, generator=self.generator)
            for heads in (layer.num_heads, layer.num_kv_heads, layer.num_kv_heads)
        )
        if self.wide_range:
            q = q * QUERY_GAIN
            octaves = torch.rand(num_tokens, 1, 1, generator=self.generator) * 2 - 1
            v = v * torch.exp2(octaves * VALUE_OCTAVES)
        return q.to(self.dtype), k.to(self.dtype), v.to(self.dtype)

    def run_eagerly(
        self,
        label: str,
        metadata: AttentionMetadata,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        try:
            with set_forward_context(metadata):
                return self.layer(*(x.flatten(1).to(self.device) for x in (q, k, v)))
        except Exception as exc:  # noqa: BLE001 - reported with the step that raised it
            target.fail(
                f"attention backend {self.backend.get_name()} raised {type(exc).__name__} on "
                f"{label}: {exc}"
            )

    def replay_in_full_graph(
        self,
        label: str,
        static_layout: str,
        metadata: AttentionMetadata,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        """Capture the layer once on the static layout, as a runner does (padding requests
        only, after a warm-up run), then copy this step into the captured q/k/v buffers and
        metadata tensors and replay: the graph must compute the step without Python."""
        name, support = self.backend.get_name(), self.backend.graph_support.name
        padded = metadata.num_actual_tokens + PADDING
        static = StaticAttentionMetadata(
            padded, self.num_blocks, self.block_size, self.scratch_block, self.device
        )
        lay_out = getattr(static, static_layout)
        buffers = [
            torch.zeros(x.flatten(1).shape, dtype=x.dtype, device=self.device) for x in (q, k, v)
        ]
        graph = RecordedGraphAPI().new_graph()
        try:
            # Each run with metadata of its own, as a runner's: what a backend keeps in
            # the warm-up's step_cache must not stand in for work the capture records.
            with set_forward_context(lay_out(padded, None)):
                self.layer(*buffers)  # the warm-up run before a capture
            with set_forward_context(lay_out(padded, None)):
                out = graph.capture(lambda: self.layer(*buffers), None, quiet=True)
        except StaticGraphError as exc:
            target.fail(
                f"attention backend {name} declares graph_support {support} but cannot be "
                f"captured in a full graph on the static {static_layout} layout: {exc}"
            )
        except Exception as exc:  # noqa: BLE001 - reported with the capture that raised it
            target.fail(
                f"attention backend {name} raised {type(exc).__name__} on the warm-up or the "
                f"capture of a full graph on the static {static_layout} layout (padding "
                f"requests only, as a runner captures it): {exc}"
            )
        for buffer, value in zip(buffers, (q, k, v), strict=True):
            buffer.copy_(value.flatten(1))
        lay_out(padded, metadata)  # this step's metadata, into the tensors the graph reads
        try:
            graph.replay()
        except Exception as exc:  # noqa: BLE001 - reported with the step that raised it
            target.fail(f"attention backend {name} raised {type(exc).__name__} on {label}: {exc}")
        return out

    def compare(
        self, got: torch.Tensor, expected: AttentionTerms, batch: list[Request], what: str
    ) -> None:
        """Fail with the worst element, relative to what its dtype and reductions allow,
        when ``got`` is not within ``tolerance.attention_bound`` of the reference."""
        allowed = attention_bound(
            expected.out,
            expected.weighted_rms,
            expected.weighted_abs,
            expected.score_magnitude,
            expected.seq_lens,
            self.layer.head_size,
            self.dtype,
        )
        error = (got - expected.out).abs()
        if bool((error <= allowed).all()) and bool(torch.isfinite(got).all()):
            return
        excess = torch.nan_to_num(error / allowed, nan=float("inf"))
        token, head, dim = (int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
        got_value, expected_value = distinct_strings(
            float(got[token, head, dim]), float(expected.out[token, head, dim])
        )
        group = self.layer.num_heads // self.layer.num_kv_heads
        seq_len = int(expected.seq_lens[token].max())
        target.fail(
            f"attention backend {self.backend.get_name()} ({self.dtype}) differs from the "
            f"reference on {what}: max |error| {float(error.max()):.3g}; the worst element is "
            f"{float(excess[token, head, dim]):.3g} times the error allowed there "
            f"({float(allowed[token, head, dim]):.3g}, from {self.dtype}'s precision, a "
            f"float32 accumulation over {seq_len} keys and {self.layer.head_size} dims: "
            f"see slotwise.testing.conformance.tolerance), worst at token {token} "
            f"({locate(token, batch)}), head {head} (reads key/value head {head // group}), "
            f"dim {dim}: got {got_value}, expected {expected_value}"
        )


def locate(token: int, batch: list[Request]) -> str:
    """Which request of ``batch`` the step's ``token`` belongs to, and where in it."""
    start = 0
    for r, (query_len, context_len, _) in enumerate(batch):
        if token < start + query_len:
            index = token - start
            return (
                f"request {r}, query token {index} of {query_len}, at position "
                f"{context_len + index} after {context_len} cached"
            )
        start += query_len
    raise ValueError(f"token {token} is past the {start} tokens of the batch")


def distinct_strings(got: float, expected: float) -> tuple[str, str]:
    """Both values with 6 significant digits, or as many more as it takes to tell them
    apart."""
    for digits in range(6, 18):
        got_text, expected_text = f"{got:.{digits}g}", f"{expected:.{digits}g}"
        if got_text != expected_text:
            break
    return got_text, expected_text


def step_lengths(batch: list[Request]) -> tuple[list[int], list[int], list[list[int]]]:
    """A step's query lengths, context lengths and block tables, as builders take them."""
    return [q for q, _, _ in batch], [c for _, c, _ in batch], [b for _, _, b in batch]


def scenario_steps(
    scenario: str, requests: list[tuple[int, int]], block_ids: list[list[int]], chunk: int
) -> list[tuple[str, list[Request]]]:
    """The scenario's batch, preceded by the steps writing the requests' cached context:
    prefills of up to ``chunk`` tokens (a 1-token piece is a decode, ordered first)."""
    batch = [(q, c, b) for (q, c), b in zip(requests, block_ids, strict=True)]
    longest = max(c for _, c, _ in batch)
    steps = []
    for written in range(0, longest, chunk):
        pieces = [(min(chunk, c - written), written, b) for _, c, b in batch if c > written]
        pieces.sort(key=lambda r: r[0] != 1)
        label = (
            "the step writing the cached context"
            if longest <= chunk
            else f"the step writing cached positions {written} to {written + chunk - 1}"
        )
        steps.append((label, pieces))
    return [*steps, (f"the {scenario} batch", batch)]


def select_backend(
    platform: Platform, head_size: int, dtype: torch.dtype
) -> tuple[type[AttentionBackend], int]:
    """The backend the platform picks for ``dtype``, with the first block size it serves.

    A dtype no backend serves is skipped (a device may lack float16), unless none of
    DTYPES is served: then there is no attention at all, and the check fails.
    """
    found, refusals = _try_select(platform, head_size, dtype)
    if found is not None:
        return found
    if any(_try_select(platform, head_size, other)[0] for other in DTYPES if other != dtype):
        target.skip(
            f"no attention backend serves {dtype} for head size {head_size}: " + "; ".join(refusals)
        )
    select_first_backend(platform, head_size)  # fails, with every refusal
    raise AssertionError("unreachable: select_first_backend found no backend")


def select_first_backend(
    platform: Platform, head_size: int
) -> tuple[type[AttentionBackend], torch.dtype, int]:
    """The backend of the first of DTYPES the platform serves, its dtype and block size."""
    refusals = []
    for dtype in DTYPES:
        found, refused = _try_select(platform, head_size, dtype)
        if found is not None:
            return found[0], dtype, found[1]
        refusals += [f"{dtype} with {refusal}" for refusal in refused]
    target.fail(f"no attention backend for head size {head_size}: " + "; ".join(refusals))


def _try_select(
    platform: Platform, head_size: int, dtype: torch.dtype
) -> tuple[tuple[type[AttentionBackend], int] | None, list[str]]:
    """(backend, block size) for the first block size served, or None and the refusals."""
    refusals = []
    for block_size in BLOCK_SIZES:
        try:
            backend = select_attention_backend(
                platform, head_size=head_size, dtype=dtype, block_size=block_size
            )
        except AttentionBackendError as exc:
            refusals.append(f"block size {block_size}: {exc}")
        else:
            return (backend, block_size), refusals
    return None, refusals


def shuffled_block_tables(
    requests: list[tuple[int, int]], block_size: int, generator: torch.Generator
) -> tuple[list[list[int]], int]:
    """Non-contiguous blocks for each request, and the cache size (with spare blocks)."""
    needed = [-(-(q + c) // block_size) for q, c in requests]
    num_blocks = sum(needed) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    starts = itertools.accumulate(needed, initial=0)
    return [order[start : start + n] for start, n in zip(starts, needed, strict=False)], num_blocks
