"""The stub's RMSNorm replacement agrees with ``RMSNorm.forward_native`` and with an
independent reference written here, so running a model on the stub changes its numbers
by rounding only."""

from __future__ import annotations

import pytest
import torch

from slotwise.plugin_api import RMSNorm
from slotwise_ascend_stub.custom_ops import rms_norm

#: (atol, rtol) per dtype: fp32 differs only in summation order, bf16 by about one ulp.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 1.6e-2)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCE[expected.dtype]
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """In float64, rounded once to the input dtype."""
    x64 = x.double()
    rms = (x64 * x64).sum(dim=-1, keepdim=True).div(x.shape[-1]).add(eps).sqrt()
    return (x64 / rms * weight.double()).to(x.dtype)


def make_rms_norm(hidden: int, dtype: torch.dtype, seed: int) -> RMSNorm:
    gen = torch.Generator().manual_seed(seed)
    layer = RMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(hidden, generator=gen) + 0.5)
    return layer.to(dtype)


@DTYPES
@pytest.mark.parametrize("hidden", [64, 80])
def test_stub_rms_norm_without_residual(dtype, hidden):
    layer = make_rms_norm(hidden, dtype, seed=hidden)
    x = (torch.randn(3, 5, hidden, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    original = x.clone()
    out = rms_norm(layer, x)
    assert out.shape == x.shape
    assert_close(out, layer.forward_native(x))
    assert_close(out, rms_norm_reference(x, layer.weight, layer.eps))
    assert torch.equal(x, original)


@DTYPES
def test_stub_rms_norm_adds_the_residual_first_and_returns_the_sum(dtype):
    hidden = 64
    layer = make_rms_norm(hidden, dtype, seed=2)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, hidden, generator=gen).to(dtype)
    residual = torch.randn(7, hidden, generator=gen).to(dtype)
    inputs = (x.clone(), residual.clone())
    normed, new_residual = rms_norm(layer, x, residual)
    native_normed, native_residual = layer.forward_native(x, residual)
    summed = x + residual
    assert torch.equal(new_residual, summed) and torch.equal(native_residual, summed)
    assert_close(normed, native_normed)
    assert_close(normed, rms_norm_reference(summed, layer.weight, layer.eps))
    assert torch.equal(x, inputs[0]) and torch.equal(residual, inputs[1])


def test_stub_rms_norm_of_no_tokens_is_empty():
    assert rms_norm(RMSNorm(16), torch.empty(0, 16)).shape == (0, 16)
