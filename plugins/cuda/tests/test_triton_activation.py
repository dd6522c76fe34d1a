"""``silu_and_mul`` against plain torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slotwise_cuda.kernels.activation import silu_and_mul

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


@pytest.mark.parametrize(
    "dtype, d",
    [
        (torch.float32, 64),
        (torch.float32, 3000),  # several column blocks, the last one partial
        (torch.float16, 80),
        (torch.bfloat16, 96),
    ],
)
def test_matches_reference(device, dtype, d):
    gen = torch.Generator().manual_seed(d)
    x = (4 * torch.randn(3, 2 * d, generator=gen)).to(dtype).to(device)
    out = torch.empty(3, d, dtype=dtype, device=device)
    silu_and_mul(x, out)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference(x), atol=tol, rtol=tol)


def test_strided_rows(device):
    wide = torch.randn(4, 200, device=device)
    x = wide[:, :128]
    out = torch.empty(4, 64, device=device)
    silu_and_mul(x, out)
    torch.testing.assert_close(out, reference(x), atol=1e-5, rtol=1e-5)


def test_rejects_bad_arguments(device):
    x = torch.randn(3, 64, device=device)
    with pytest.raises(ValueError, match=r"out: expected shape \[num_tokens, d\] = \(3, 32\)"):
        silu_and_mul(x, torch.empty(3, 64, device=device))
    with pytest.raises(ValueError, match=r"x: expected shape \[num_tokens, 2 \* d\]"):
        silu_and_mul(x[:, :63], torch.empty(3, 31, device=device))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_on_the_gpu_in_bfloat16():
    x = torch.randn(300, 2 * 11008, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(300, 11008, device="cuda", dtype=torch.bfloat16)
    silu_and_mul(x, out)
    tol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(out, reference(x), atol=tol, rtol=tol)
