"""``torch.ops.slotwise_cpu.linear`` and the CPU piecewise backend that routes to it.

Oracles: a float64 matrix product (the kernel accumulates in float32 and rounds once, so
it must agree to the output's own rounding), and ``F.linear`` itself for every call the
op hands on to torch.  Whole models: level 3 against the same model run eagerly.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from kernel_oracles import torch_product, within_output_rounding

from slotwise.compilation.config import CompilationConfig
from slotwise_cpu import linear, native
from slotwise_cpu.piecewise import route_linear_layers
from slotwise_engine.models.llama import build_llama
from slotwise_engine.runner.model_runner import ModelRunner

KERNEL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    assert native.load_kernels() is not None, "the kernels must build where compilers are"


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
# The preset's shapes; 1003 outputs end on 11 rows past the last 16 (AMX takes whole
# blocks of 16 rows of inner sizes of whole 32s, the vector code the rest); 33 and 1
# are inner sizes AMX does not take.
@pytest.mark.parametrize(
    "shape", [(1024, 512), (2752, 512), (512, 1376), (1003, 96), (7, 33), (5, 1)]
)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("rows", ["one", "two", "three", "four", "five", "most", "most-3"])
def test_products_of_a_few_rows_match_float64(dtype, shape, bias, rows):
    # The kernel takes rows of x four at a time: "most-3" and "five" end on a group of
    # one; it reads one weight row at a time up to three rows of float32 (one with AVX2
    # alone; four of the 2-byte dtypes), four weight rows at a time above; up to "four"
    # in one pass, which loads x and the weights differently from the passes of more rows.
    most = linear.max_kernel_rows(dtype)
    counts = {
        "one": 1,
        "two": 2,
        "three": 3,
        "four": 4,
        "five": 5,
        "most": most,
        "most-3": most - 3,
    }
    rows = max(1, min(counts[rows], most))
    outputs, inner = shape
    generator = torch.Generator().manual_seed(outputs + inner)
    x = torch.randn(rows, inner, generator=generator).to(dtype)
    weight = torch.randn(outputs, inner, generator=generator).to(dtype)
    b = torch.randn(outputs, generator=generator).to(dtype) if bias else None
    out = torch.ops.slotwise_cpu.linear(x, weight, b)
    expected = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert out.dtype == dtype and out.shape == (rows, outputs)
    assert within_output_rounding(out, expected, x, weight)
    # torch's own GEMM keeps to the same bound.
    assert within_output_rounding(F.linear(x, weight, b), expected, x, weight)


def test_the_kernel_takes_the_rows_it_is_faster_for_on_this_cpu(caplog):
    # With neither AVX-512 nor AVX2 the kernel has only scalar code, 4x to 25x slower
    # than torch: it takes no rows. With AVX2 alone it beats torch up to 16 rows in every
    # dtype. With AVX-512: on AMX tiles, and with AVX512-BF16 on a CPU without AMX (AMD's
    # Zen 4), up to 16 rows of bfloat16; elsewhere up to 4, beyond which oneDNN is faster.
    flags = native._cpu_flags().split()  # the CPU's feature flags, as the build keys on
    if "avx512f" not in flags and not {"avx2", "fma", "f16c"} <= set(flags):
        linear._say_torch_multiplies.cache_clear()
        with caplog.at_level(logging.INFO, logger="slotwise"):
            assert [linear.max_kernel_rows(dtype) for dtype in KERNEL_DTYPES] == [0, 0, 0]
        assert not any(linear.runs_kernel(dtype) for dtype in KERNEL_DTYPES)
        assert caplog.text.count("linear layers run torch's GEMM") == 1  # once, not per call
        return
    if "avx512f" not in flags:
        assert [linear.max_kernel_rows(dtype) for dtype in KERNEL_DTYPES] == [16, 16, 16]
        return
    fast = "amx_bf16" in flags or "avx512_bf16" in flags
    assert linear.max_kernel_rows(torch.bfloat16) == (16 if fast else 4)
    assert linear.max_kernel_rows(torch.float32) == 16
    assert linear.max_kernel_rows(torch.float16) == 16


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_every_row_count_the_kernel_takes_matches_float64(dtype):
    # The AVX2 code cuts the rows of x of 2-byte dtypes into tiles of three to six (5 is
    # one tile, 8 two of four, 13 three of 5, 5 and 3); an inner size of 100 ends on 4
    # elements past the last whole vector, 37 outputs one past the last group of four.
    generator = torch.Generator().manual_seed(37)
    weight = torch.randn(37, 100, generator=generator).to(dtype)
    bias = torch.randn(37, generator=generator).to(dtype)
    for rows in range(1, linear.max_kernel_rows(dtype) + 1):
        x = torch.randn(rows, 100, generator=generator).to(dtype)
        out = torch.ops.slotwise_cpu.linear(x, weight, bias)
        expected = x.double() @ weight.double().T + bias.double()
        assert within_output_rounding(out, expected, x, weight), f"{rows} rows"


@pytest.mark.parametrize("rows", ["one", "most"])
def test_rows_of_a_wider_tensor_are_read_with_their_stride(rows):
    rows = 1 if rows == "one" else linear.max_kernel_rows(torch.bfloat16)
    x = torch.randn(rows + 2, 64).to(torch.bfloat16)[1 : rows + 1, :32]  # row stride 64
    weight = torch.randn(16, 32).to(torch.bfloat16)
    out = torch.ops.slotwise_cpu.linear(x, weight, None)
    assert within_output_rounding(out, x.double() @ weight.double().T, x, weight)


@pytest.mark.parametrize(
    "x, weight",
    [
        (torch.randn(2, 64).double(), torch.randn(32, 64).double()),  # not a kernel dtype
        (torch.randn(17, 64).float(), torch.randn(32, 64).float()),  # more rows
        (torch.randn(1, 64).float(), torch.randn(64, 32).float().T),  # strided weight
        (torch.randn(2, 1, 64).float(), torch.randn(32, 64).float()),  # 3-D input
    ],
    ids=["float64", "more-rows", "transposed-weight", "3d"],
)
def test_what_the_kernel_does_not_take_is_exactly_f_linear(x, weight):
    assert torch.equal(torch.ops.slotwise_cpu.linear(x, weight, None), F.linear(x, weight))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [17, 128])
@pytest.mark.parametrize("layout", ["contiguous", "transposed-weight", "3d"])
def test_half_products_the_kernel_does_not_take_are_f_linear_where_torch_is_fast(
    dtype, rows, layout
):
    # Elsewhere torch's half GEMM is a generic loop many times slower than float32's, so
    # the op multiplies in float32 and rounds once: the product oneDNN's half GEMMs give.
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=generator).to(dtype)
    weight = torch.randn(48, 96, generator=generator).to(dtype)
    bias = torch.randn(48, generator=generator).to(dtype)
    if layout == "transposed-weight":
        weight = weight.T.contiguous().T
    elif layout == "3d":
        x = x.unsqueeze(0)
    out = torch.ops.slotwise_cpu.linear(x, weight, bias)
    assert out.dtype == dtype and torch.equal(out, torch_product(x, weight, bias))
    exact = x.double() @ weight.double().T + bias.double()
    assert within_output_rounding(out.reshape(rows, 48), exact.reshape(rows, 48), x, weight)


def test_the_op_traces_with_its_fake_implementation():
    compiled = torch.compile(
        lambda x, w: torch.ops.slotwise_cpu.linear(x, w, None), backend="eager", fullgraph=True
    )
    x, weight = torch.randn(1, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    torch.testing.assert_close(compiled(x, weight), torch.ops.slotwise_cpu.linear(x, weight, None))


class TwoLinears(torch.nn.Module):
    def forward(self, x, w1, w2, bias):
        return F.linear(torch.relu(F.linear(x, w1)), w2, bias=bias)


@pytest.mark.parametrize(
    "dtype, routed",
    [(torch.float32, 2), (torch.bfloat16, 2), (torch.float16, 2), (torch.float64, 0)],
    ids=str,
)
def test_linear_layers_of_kernel_dtypes_are_routed_to_the_op(dtype, routed):
    graph = torch.fx.symbolic_trace(TwoLinears())
    inputs = [torch.randn(1, 16), torch.randn(8, 16), torch.randn(4, 8), torch.randn(4)]
    inputs = [t.to(dtype) for t in inputs]
    expected = graph(*inputs)
    routed = routed if linear.runs_kernel(dtype) else 0  # none without AVX-512 or AVX2
    assert route_linear_layers(graph, inputs) == routed
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.slotwise_cpu.linear.default) == routed
    torch.testing.assert_close(graph(*inputs), expected, atol=0.02, rtol=0.02)


def test_trainable_weights_stay_on_f_linear_and_get_their_gradients():
    # The op has no backward: routing a weight that requires grad would lose its gradient.
    graph = torch.fx.symbolic_trace(TwoLinears())
    weights = [torch.randn(8, 16, requires_grad=True), torch.randn(4, 8, requires_grad=True)]
    inputs = [torch.randn(1, 16), *weights, torch.randn(4)]
    assert route_linear_layers(graph, inputs) == 0
    graph(*inputs).sum().backward()
    expected = [w.detach().clone().requires_grad_() for w in weights]
    TwoLinears()(inputs[0], *expected, inputs[3]).sum().backward()
    for weight, reference in zip(weights, expected, strict=True):
        torch.testing.assert_close(weight.grad, reference.grad)


def decode_logits(model, batch: int) -> torch.Tensor:
    runner = ModelRunner(model, num_blocks=32)
    requests = runner.add_requests([[7, 3, 9, 11][: 2 + r] for r in range(batch)], 2)
    runner.step(requests)  # the prefill
    for request in requests:
        request.tokens.append(5)
    return runner.step(requests)  # a decode step


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
def test_level3_with_the_kernels_gives_the_eager_logits(dtype, batch, caplog):
    """The tiny preset at level 3 (eager compiler, so only the routing differs) against
    level 0, each with its own seeded copy of the weights: equal to the logits' rounding."""
    caplog.set_level(logging.DEBUG, logger="slotwise")
    eager = build_llama("tiny", dtype=dtype, compilation_config=CompilationConfig(level=0))
    level3 = build_llama("tiny", dtype=dtype, compilation_config=CompilationConfig(backend="eager"))
    expected, got = decode_logits(eager, batch), decode_logits(level3, batch)
    # The pieces routed to the op, where the kernel serves rows on this CPU.
    assert ("linear layers of piece" in caplog.text) == linear.runs_kernel(dtype)
    # Two units in the last place of bfloat16/float16 logits; in float32 the kernel and
    # MKL sum in other orders, which moves the logits by more than their own rounding.
    ulps = (1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps) * expected.abs().max()
    assert (got - expected).abs().max() <= ulps


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_level3_under_inductor_gives_the_eager_logits(dtype):
    eager = build_llama("small", dtype=dtype, compilation_config=CompilationConfig(level=0))
    level3 = build_llama("small", dtype=dtype, compilation_config=CompilationConfig())
    for batch in (1, 4):
        expected, got = decode_logits(eager, batch), decode_logits(level3, batch)
        tolerance = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps * 4
        assert (got - expected).abs().max() <= tolerance * max(1.0, expected.abs().max())
