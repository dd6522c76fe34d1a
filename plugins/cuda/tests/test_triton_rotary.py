"""``rotary_embedding`` against plain torch, neox and gpt-j styles, in place on views."""

from __future__ import annotations

import pytest
import torch

from slotwise_cuda.kernels.rotary import rotary_embedding

MAX_POSITION = 64
NUM_HEADS = 4
NUM_KV_HEADS = 2
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


def cos_sin_cache(head_size: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2).float() / head_size)
    angles = torch.outer(torch.arange(MAX_POSITION).float(), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def reference(
    positions: torch.Tensor, x: torch.Tensor, cache: torch.Tensor, head_size: int, is_neox: bool
) -> torch.Tensor:
    """Rotate a copy of ``x`` [num_tokens, heads * head_size] in fp32."""
    heads = x.float().unflatten(-1, (-1, head_size))
    cos, sin = cache[positions.long()].float()[:, None, :].chunk(2, dim=-1)
    if is_neox:
        x1, x2 = heads.chunk(2, dim=-1)
    else:
        x1, x2 = heads[..., 0::2], heads[..., 1::2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat([o1, o2], dim=-1) if is_neox else torch.stack([o1, o2], -1).flatten(-2)
    return rotated.flatten(-2).to(x.dtype)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize(
    "head_size, dtype, positions_dtype",
    [
        (64, torch.float32, torch.int64),
        (80, torch.float32, torch.int32),  # half of 80 is not a power of two
        (128, torch.bfloat16, torch.int64),
    ],
)
def test_matches_reference_on_views_of_a_fused_qkv(
    device, is_neox, head_size, dtype, positions_dtype
):
    gen = torch.Generator().manual_seed(head_size)
    num_tokens = 5
    q_width, k_width = NUM_HEADS * head_size, NUM_KV_HEADS * head_size
    qkv = torch.randn(num_tokens, q_width + 2 * k_width, generator=gen).to(dtype).to(device)
    query, key = qkv[:, :q_width], qkv[:, q_width : q_width + k_width]
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=gen)
    positions = positions.to(positions_dtype).to(device)
    cache = cos_sin_cache(head_size).to(device)
    untouched = qkv[:, q_width + k_width :].clone()
    expected_q = reference(positions, query, cache, head_size, is_neox)
    expected_k = reference(positions, key, cache, head_size, is_neox)

    rotary_embedding(positions, query, key, cache, head_size, is_neox)

    tol = TOLERANCE[dtype]
    torch.testing.assert_close(query, expected_q, atol=tol, rtol=tol)
    torch.testing.assert_close(key, expected_k, atol=tol, rtol=tol)
    assert torch.equal(qkv[:, q_width + k_width :], untouched), "value columns were written"


def test_position_zero_is_the_identity(device):
    query = torch.randn(2, NUM_HEADS * 32, device=device)
    key = torch.randn(2, NUM_KV_HEADS * 32, device=device)
    expected_q, expected_k = query.clone(), key.clone()
    positions = torch.zeros(2, dtype=torch.int64, device=device)
    rotary_embedding(positions, query, key, cos_sin_cache(32).to(device), 32, is_neox=False)
    torch.testing.assert_close(query, expected_q)
    torch.testing.assert_close(key, expected_k)


def test_rejects_bad_arguments(device):
    query = torch.randn(2, NUM_HEADS * 32, device=device)
    key = torch.randn(2, NUM_KV_HEADS * 32, device=device)
    positions = torch.zeros(2, dtype=torch.int64, device=device)
    cache = cos_sin_cache(32).to(device)
    with pytest.raises(ValueError, match=r"cos_sin_cache: expected shape .* = \(\?, 64\)"):
        rotary_embedding(positions, query, key, cache, 64, is_neox=True)
    with pytest.raises(ValueError, match=r"key: expected shape \[num_tokens, num_kv_heads"):
        rotary_embedding(positions, query, key[:1], cache, 32, is_neox=True)
    with pytest.raises(ValueError, match=r"positions: expected dtype in \(int32, int64\)"):
        rotary_embedding(positions.float(), query, key, cache, 32, is_neox=True)
    with pytest.raises(ValueError, match=r"key: width 60 is not a multiple of head_size 32"):
        rotary_embedding(positions, query, key[:, :60], cache, 32, is_neox=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_on_the_gpu_in_bfloat16(is_neox):
    query = torch.randn(300, 32 * 128, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(300, 8 * 128, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, MAX_POSITION, (300,), device="cuda")
    cache = cos_sin_cache(128).cuda()
    expected_q = reference(positions, query, cache, 128, is_neox)
    expected_k = reference(positions, key, cache, 128, is_neox)
    rotary_embedding(positions, query, key, cache, 128, is_neox)
    tol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(query, expected_q, atol=tol, rtol=tol)
    torch.testing.assert_close(key, expected_k, atol=tol, rtol=tol)
