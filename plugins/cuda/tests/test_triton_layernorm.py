"""``rms_norm`` against plain torch, including rows wider than one chunk."""

from __future__ import annotations

import pytest
import torch

from slotwise_cuda.kernels.layernorm import rms_norm

EPS = 1e-6
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x32 * inv_rms * weight.float()).to(x.dtype)


@pytest.mark.parametrize(
    "dtype, hidden",
    [
        (torch.float32, 64),
        (torch.float32, 80),
        (torch.float32, 5000),  # past one 4096-wide chunk, not a multiple of it
        (torch.float16, 128),
        (torch.bfloat16, 80),
    ],
)
def test_matches_reference(device, dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = (3 * torch.randn(5, hidden, generator=gen)).to(dtype).to(device)
    weight = (1 + torch.randn(hidden, generator=gen)).to(dtype).to(device)
    out = torch.empty_like(x)
    rms_norm(x, weight, EPS, out)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference(x, weight, EPS), atol=tol, rtol=tol)


def test_strided_rows_and_float32_weight_with_bfloat16_input(device):
    wide = torch.randn(4, 96, device=device).to(torch.bfloat16)
    x = wide[:, 16:80]
    weight = torch.randn(64, device=device)
    out = torch.empty(4, 64, dtype=torch.bfloat16, device=device)
    rms_norm(x, weight, EPS, out)
    tol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(out, reference(x, weight, EPS), atol=tol, rtol=tol)


def test_rejects_bad_arguments(device):
    x = torch.randn(3, 64, device=device)
    with pytest.raises(ValueError, match=r"weight: expected shape \[hidden\] = \(64\)"):
        rms_norm(x, torch.ones(32, device=device), EPS, torch.empty_like(x))
    with pytest.raises(ValueError, match=r"out: expected dtype in \(float32\)"):
        rms_norm(x, torch.ones(64, device=device), EPS, torch.empty_like(x).half())
    with pytest.raises(ValueError, match=r"x: expected shape \[num_tokens, hidden\]"):
        rms_norm(x[0], torch.ones(64, device=device), EPS, x[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_on_the_gpu_in_bfloat16():
    x = torch.randn(300, 8192, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    rms_norm(x, weight, EPS, out)
    tol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(out, reference(x, weight, EPS), atol=tol, rtol=tol)
