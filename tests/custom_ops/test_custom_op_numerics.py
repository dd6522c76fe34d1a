"""Every CPU implementation of the core ops agrees with ``forward_native`` and with an
independent reference written here, so switching platform or setting never changes a
model's numbers beyond rounding.

The Triton implementations are checked in plugins/cuda/tests/test_custom_op_triton.py,
the ascend stub's RMSNorm replacement in plugins/ascend_stub/tests/test_ascend_stub_rms_norm.py.
"""

from __future__ import annotations

import pytest
import torch

from slotwise.layers import RMSNorm, RotaryEmbedding, SiluAndMul
from slotwise.layers.layernorm import norm_with_residual

#: (atol, rtol) per dtype: fp32 differs only in summation order, bf16 by about one ulp.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 1.6e-2)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def cpu_implementations(cls: type) -> list[str]:
    """The ``forward_*`` methods of ``cls`` that run on plain CPU tensors."""
    return [name for name in ("forward_native", "forward_cpu") if hasattr(cls, name)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCE[expected.dtype]
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


# -- RMSNorm ---------------------------------------------------------------------------


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """In float64, rounded once to the input dtype."""
    x64 = x.double()
    rms = (x64 * x64).sum(dim=-1, keepdim=True).div(x.shape[-1]).add(eps).sqrt()
    return (x64 / rms * weight.double()).to(x.dtype)


#: RMSNorm's CPU methods, each called as ``f(layer, x, ...)``.
RMS_NORMS = {name: getattr(RMSNorm, name) for name in cpu_implementations(RMSNorm)}


def make_rms_norm(hidden: int, dtype: torch.dtype, seed: int) -> RMSNorm:
    gen = torch.Generator().manual_seed(seed)
    layer = RMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(hidden, generator=gen) + 0.5)
    return layer.to(dtype)


@DTYPES
@pytest.mark.parametrize("method", RMS_NORMS)
@pytest.mark.parametrize("hidden", [64, 80])
def test_rms_norm_without_residual(method, dtype, hidden):
    layer = make_rms_norm(hidden, dtype, seed=hidden)
    x = (torch.randn(3, 5, hidden, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    original = x.clone()
    out = RMS_NORMS[method](layer, x)
    assert out.shape == x.shape
    assert_close(out, layer.forward_native(x))
    assert_close(out, rms_norm_reference(x, layer.weight, layer.eps))
    assert torch.equal(x, original)


@DTYPES
@pytest.mark.parametrize("method", RMS_NORMS)
def test_rms_norm_adds_the_residual_first_and_returns_the_sum(method, dtype):
    hidden = 64
    layer = make_rms_norm(hidden, dtype, seed=2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, hidden, generator=gen).to(dtype)
    residual = torch.randn(7, hidden, generator=gen).to(dtype)
    inputs = (x.clone(), residual.clone())
    normed, new_residual = RMS_NORMS[method](layer, x, residual)
    native_normed, native_residual = layer.forward_native(x, residual)
    summed = x + residual
    assert torch.equal(new_residual, summed) and torch.equal(native_residual, summed)
    assert_close(normed, native_normed)
    assert_close(normed, rms_norm_reference(summed, layer.weight, layer.eps))
    assert torch.equal(x, inputs[0]) and torch.equal(residual, inputs[1])


@pytest.mark.parametrize("method", RMS_NORMS)
def test_rms_norm_of_no_tokens_is_empty(method):
    layer = RMSNorm(16)
    assert RMS_NORMS[method](layer, torch.empty(0, 16)).shape == (0, 16)


def test_norm_with_residual_applies_the_norm_to_the_sum_and_returns_the_sum():
    def double(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    x, residual = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])
    assert torch.equal(norm_with_residual(double, x, None), torch.tensor([2.0, 4.0]))
    normed, summed = norm_with_residual(double, x, residual)
    assert torch.equal(normed, torch.tensor([22.0, 44.0]))
    assert torch.equal(summed, torch.tensor([11.0, 22.0]))


# -- SiluAndMul ------------------------------------------------------------------------


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    gate, up = x[..., :d].double(), x[..., d:].double()
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)


@DTYPES
@pytest.mark.parametrize("method", cpu_implementations(SiluAndMul))
@pytest.mark.parametrize("shape", [(6, 2 * 64), (2, 3, 2 * 40)], ids=["2d", "3d"])
def test_silu_and_mul(method, dtype, shape):
    layer = SiluAndMul()
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(4)) * 4).to(dtype)
    out = getattr(layer, method)(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    assert_close(out, layer.forward_native(x))
    assert_close(out, silu_and_mul_reference(x))


# -- RotaryEmbedding -------------------------------------------------------------------

MAX_POSITION = 4096
NUM_HEADS, NUM_KV_HEADS = 4, 2


def rope_reference(
    positions: torch.Tensor,
    x: torch.Tensor,
    head_size: int,
    base: float,
    is_neox_style: bool,
) -> torch.Tensor:
    """Rotate ``x`` [tokens, heads * head_size] in float64, from the angles themselves.

    Neox style: ``x * cos + rotate_half(x) * sin`` where ``rotate_half`` swaps the two
    halves of the head and negates the new first half.  GPT-J style: the same over
    interleaved pairs ``(x[2i], x[2i + 1])``.
    """
    exponents = torch.arange(0, head_size, 2, dtype=torch.float64) / head_size
    inv_freq = 1.0 / (base**exponents)
    angles = positions.double()[:, None] * inv_freq[None, :]  # [tokens, head_size / 2]
    heads = x.double().reshape(x.shape[0], -1, head_size)
    if is_neox_style:
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :]
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :]
        half = head_size // 2
        rotated_half = torch.cat([-heads[..., half:], heads[..., :half]], dim=-1)
    else:
        cos = angles.cos().repeat_interleave(2, dim=-1)[:, None, :]
        sin = angles.sin().repeat_interleave(2, dim=-1)[:, None, :]
        pairs = heads.reshape(*heads.shape[:-1], head_size // 2, 2)
        rotated_half = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return (heads * cos + rotated_half * sin).reshape(x.shape).to(x.dtype)


def rope_inputs(
    head_size: int, dtype: torch.dtype, positions_dtype: torch.dtype = torch.int64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(head_size)
    num_tokens = 9
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=gen)
    positions[:2] = torch.tensor([0, MAX_POSITION - 1])
    query = torch.randn(num_tokens, NUM_HEADS * head_size, generator=gen).to(dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS * head_size, generator=gen).to(dtype)
    return positions.to(positions_dtype), query, key


#: fp32 angles of positions in the thousands are off by about 1e-4 radians from float64
#: ones, which moves outputs by a few 1e-4.
ROPE_REFERENCE_TOLERANCE = {torch.float32: (1e-3, 1e-3), torch.bfloat16: (3e-2, 1.6e-2)}


@DTYPES
@pytest.mark.parametrize("is_neox_style", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("method", cpu_implementations(RotaryEmbedding))
@pytest.mark.parametrize("head_size", [64, 80])
def test_rotary_embedding_matches_rotate_half_and_interleaved_pairs(
    method, head_size, is_neox_style, dtype
):
    base = 10000.0
    layer = RotaryEmbedding(head_size, MAX_POSITION, base=base, is_neox_style=is_neox_style)
    positions, query, key = rope_inputs(head_size, dtype)
    inputs = (query.clone(), key.clone())
    out_query, out_key = getattr(layer, method)(positions, query, key)
    native_query, native_key = layer.forward_native(positions, query, key)
    assert_close(out_query, native_query)
    assert_close(out_key, native_key)
    atol, rtol = ROPE_REFERENCE_TOLERANCE[dtype]
    for out, x in ((out_query, query), (out_key, key)):
        assert out.shape == x.shape and out.dtype == dtype
        expected = rope_reference(positions, x, head_size, base, is_neox_style)
        torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    assert torch.equal(query, inputs[0]) and torch.equal(key, inputs[1])


def test_rotary_embedding_at_small_positions_is_exact_to_fp32_rounding():
    """Where fp32 angles are exact enough, the reference pins the rotation tightly."""
    for is_neox_style in (True, False):
        layer = RotaryEmbedding(32, 64, base=500000.0, is_neox_style=is_neox_style)
        positions, query, key = rope_inputs(32, torch.float32)
        positions = positions % 64
        out_query, out_key = layer(positions, query, key)
        for out, x in ((out_query, query), (out_key, key)):
            expected = rope_reference(positions, x, 32, 500000.0, is_neox_style)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_rotary_styles_differ_and_position_zero_is_the_identity():
    positions, query, key = rope_inputs(64, torch.float32)
    neox = RotaryEmbedding(64, MAX_POSITION, is_neox_style=True)
    gptj = RotaryEmbedding(64, MAX_POSITION, is_neox_style=False)
    assert not torch.allclose(neox(positions, query, key)[0], gptj(positions, query, key)[0])
    zero = torch.zeros_like(positions)
    for layer in (neox, gptj):
        out_query, out_key = layer(zero, query, key)
        assert torch.equal(out_query, query) and torch.equal(out_key, key)


def test_rotary_embedding_accepts_int32_positions():
    layer = RotaryEmbedding(64, MAX_POSITION)
    positions, query, key = rope_inputs(64, torch.float32, torch.int32)
    expected = layer(positions.long(), query, key)
    actual = layer(positions, query, key)
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)
