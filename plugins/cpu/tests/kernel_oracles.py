"""The oracles the CPU kernels' tests hold them to (float64 products, and torch's own for
what the op hands to torch), shared by the tests of the plugin's own build and of each
code path's (test_kernel_code_paths.py)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def within_output_rounding(
    out: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
) -> bool:
    """|out - expected| within one unit in the last place of out's dtype, plus the
    float32 accumulation's error over the inner dimension: Higham's probabilistic bound,
    sqrt(inner) * u * sum |x_i w_i| (u = 2^-24). A fixed 1e-4 failed an AVX2 host's
    8-lane sums of 1,376 products (errors up to 1.6e-4, 2.7x torch's own)."""
    ulp = torch.finfo(out.dtype).eps * expected.abs()
    magnitude = x.double().abs() @ weight.double().abs().T
    accumulation = x.shape[-1] ** 0.5 * 2.0**-24 * magnitude
    return bool(((out.double() - expected).abs() <= ulp + accumulation).all())


def paged_cache(num_blocks, block_size, kv_heads, head_size, dtype, generator):
    """A layer's KV cache as CPU_SDPA allocates it: [2 (keys, values), blocks, heads, block
    size, D]."""
    shape = (2, num_blocks, kv_heads, block_size, head_size)
    return torch.randn(shape, generator=generator).to(dtype)


def shuffled_block_table(lengths, block_size, num_blocks, generator, spare=2):
    """Each request's blocks drawn at random from the cache, rows padded with more."""
    width = max(math.ceil(n / block_size) for n in lengths) + spare
    rows = [torch.randperm(num_blocks, generator=generator)[:width] for _ in lengths]
    return torch.stack(rows).to(torch.int32)


def float64_reference(q, keys, values, block_table, lengths, scale):
    """Softmax attention of each one-token query over its request's tokens, in float64;
    ``keys`` and ``values`` [blocks, heads, block size, D], of any strides."""
    _, heads, head_size = q.shape
    kv_heads, block_size = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    out = []
    for r, length in enumerate(lengths):
        blocks = block_table[r, : math.ceil(length / block_size)].long()
        k = keys[blocks].transpose(1, 2).reshape(-1, kv_heads, head_size)[:length].double()
        v = values[blocks].transpose(1, 2).reshape(-1, kv_heads, head_size)[:length].double()
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[r].double() * scale, k)
        out.append(torch.einsum("ht,thd->hd", scores.softmax(-1), v))
    return torch.stack(out)


#: What float32 arithmetic may be off by: scores of up to about 40 (|q| ~ 3, 128 dims)
#: hold about 1e-5 of rounding, which the softmax passes on; torch's own float32
#: attention of these inputs is off by up to 7e-6.
FLOAT32_ATOL, FLOAT32_RTOL = 2e-5, 1e-5


def assert_matches(out, expected):
    """float32: to float32 rounding; lower precisions: the float32 arithmetic's error,
    then the output's own rounding (the kernel accumulates in float32)."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, atol=FLOAT32_ATOL, rtol=FLOAT32_RTOL)
    else:
        rounding = (expected.to(out.dtype).double() - expected).abs()
        ulp = torch.finfo(out.dtype).eps * expected.abs().clamp_min(1e-2)
        float32_error = FLOAT32_ATOL + FLOAT32_RTOL * expected.abs()
        assert ((out.double() - expected).abs() <= rounding + ulp + float32_error).all()


def torch_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` as the op hands it to torch: as is where torch has a fast GEMM in the
    dtype (oneDNN's, for bfloat16 and float16, where torch says oneDNN takes it), else in
    float32, rounded once."""
    fast = {
        torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
        torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported(),
    }
    if fast.get(x.dtype, True):
        return F.linear(x, weight, bias)
    wide_bias = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), wide_bias).to(x.dtype)
