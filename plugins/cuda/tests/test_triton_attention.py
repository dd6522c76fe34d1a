"""Paged attention kernels against a plain-torch reference.

Every case scatters each sequence over shuffled cache blocks (so tiles gather from
non-contiguous blocks), fills the rest of the cache and the block table's unused
entries with garbage, and checks that padding tokens of ``out`` stay untouched.
Under the interpreter each head size, GQA ratio and block size is covered by rotation
rather than the full product, to keep the folder fast.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
import triton

from slotwise_cuda.kernels.attention import paged_decode_attention, paged_prefill_attention

HEAD_SIZES = (32, 64, 80, 128)
GQA_RATIOS = (1, 2, 4)
BLOCK_SIZES = (8, 16, 32)
NUM_KV_HEADS = 2
#: (query_len, context_len) per sequence.
SCENARIOS = {
    "prefill": [(9, 0), (1, 0), (23, 0)],
    "chunked_prefill": [(7, 16), (12, 5), (5, 33)],
    "decode_as_prefill": [(1, 16), (1, 0), (1, 39)],
    "mixed": [(1, 20), (0, 6), (13, 0), (6, 11), (1, 8)],
}
#: Query lengths past one query tile and contexts past several K/V tiles.
LONG = [(70, 0), (40, 30), (1, 100)]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
PADDING = 2
SENTINEL = 7.0


@dataclass
class Case:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: list[int]
    scale: float
    out: torch.Tensor

    @property
    def num_real_tokens(self) -> int:
        return sum(self.query_lens)


def make_case(
    lens: list[tuple[int, int]],
    head_size: int,
    ratio: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    padding: int = PADDING,
) -> Case:
    gen = torch.Generator().manual_seed(hash((tuple(lens), head_size, ratio, block_size)) % 2**31)
    query_lens = [q for q, _ in lens]
    seq_lens = [q + c for q, c in lens]
    blocks_per_seq = [triton.cdiv(n, block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq) + 2
    # Unused entries point far outside the cache: reading one would fault or misread.
    block_table = torch.full((len(lens), width), 10 * num_blocks, dtype=torch.int32)
    for s, n in enumerate(blocks_per_seq):
        block_table[s, :n] = torch.tensor(ids[:n], dtype=torch.int32)
        ids = ids[n:]
    cache_shape = (num_blocks, block_size, NUM_KV_HEADS, head_size)
    num_tokens = sum(query_lens) + padding
    q = torch.randn(num_tokens, NUM_KV_HEADS * ratio, head_size, generator=gen)
    starts = [0, *itertools.accumulate(query_lens)]

    def on(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    return Case(
        q=on(q.to(dtype)),
        k_cache=on(torch.randn(cache_shape, generator=gen).to(dtype)),
        v_cache=on(torch.randn(cache_shape, generator=gen).to(dtype)),
        block_table=on(block_table),
        query_start_loc=on(torch.tensor(starts, dtype=torch.int32)),
        seq_lens=on(torch.tensor(seq_lens, dtype=torch.int32)),
        query_lens=query_lens,
        scale=head_size**-0.5,
        out=on(torch.full(q.shape, SENTINEL, dtype=dtype)),
    )


def reference(case: Case) -> torch.Tensor:
    """Gather each sequence's K/V through its block table and attend causally in fp32."""
    block_size = case.k_cache.shape[1]
    ratio = case.q.shape[1] // case.k_cache.shape[2]
    outs = []
    for s, q_len in enumerate(case.query_lens):
        seq_len = int(case.seq_lens[s])
        pos = torch.arange(seq_len, device=case.q.device)
        blocks = case.block_table[s, pos // block_size].long()
        k = case.k_cache[blocks, pos % block_size].float().repeat_interleave(ratio, dim=1)
        v = case.v_cache[blocks, pos % block_size].float().repeat_interleave(ratio, dim=1)
        start = int(case.query_start_loc[s])
        q = case.q[start : start + q_len].float()
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale
        q_pos = seq_len - q_len + torch.arange(q_len, device=q.device)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v))
    return torch.cat(outs)


def check(case: Case, dtype: torch.dtype) -> None:
    real = case.num_real_tokens
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(case.out[:real].float(), reference(case), atol=tol, rtol=tol)
    assert (case.out[real:] == SENTINEL).all(), "padding tokens were written"


def run_prefill(case: Case) -> None:
    paged_prefill_attention(
        case.q,
        case.k_cache,
        case.v_cache,
        case.block_table,
        case.query_start_loc,
        case.seq_lens,
        case.scale,
        case.out,
    )


def run_decode(case: Case) -> None:
    paged_decode_attention(
        case.q, case.k_cache, case.v_cache, case.block_table, case.seq_lens, case.scale, case.out
    )


PREFILL_MATRIX = [
    (scenario, head_size, GQA_RATIOS[i % 3], BLOCK_SIZES[i % 3])
    for i, (scenario, head_size) in enumerate(itertools.product(SCENARIOS, HEAD_SIZES))
]


@pytest.mark.parametrize("scenario, head_size, ratio, block_size", PREFILL_MATRIX)
def test_prefill_matches_reference(device, scenario, head_size, ratio, block_size):
    case = make_case(SCENARIOS[scenario], head_size, ratio, block_size, torch.float32, device)
    run_prefill(case)
    check(case, torch.float32)


@pytest.mark.parametrize("ratio, block_size", [(1, 32), (4, 8)])
def test_prefill_long_sequences_span_several_tiles(device, ratio, block_size):
    case = make_case(LONG, 64, ratio, block_size, torch.float32, device)
    run_prefill(case)
    check(case, torch.float32)


@pytest.mark.parametrize("head_size, ratio, block_size", [(80, 2, 16), (128, 4, 32)])
def test_prefill_in_float16(device, head_size, ratio, block_size):
    case = make_case(SCENARIOS["mixed"], head_size, ratio, block_size, torch.float16, device)
    run_prefill(case)
    check(case, torch.float16)


@pytest.mark.parametrize("ratio", [3, 8])
def test_gqa_ratios_that_do_not_fill_a_row_tile(device, ratio):
    """Rows are (token, head) pairs; 3 heads per KV head leave padding rows in a tile."""
    prefill = make_case(SCENARIOS["mixed"], 32, ratio, 16, torch.float32, device)
    run_prefill(prefill)
    check(prefill, torch.float32)
    decode = make_case(DECODE_LENS, 32, ratio, 16, torch.float32, device, padding=0)
    run_decode(decode)
    check(decode, torch.float32)


DECODE_LENS = [(1, 0), (1, 16), (1, 39), (1, 100), (1, 7)]
DECODE_MATRIX = [
    (head_size, GQA_RATIOS[i % 3], BLOCK_SIZES[(i + 1) % 3])
    for i, head_size in enumerate(HEAD_SIZES * 2)
]


@pytest.mark.parametrize("head_size, ratio, block_size", DECODE_MATRIX)
def test_decode_matches_reference(device, head_size, ratio, block_size):
    case = make_case(DECODE_LENS, head_size, ratio, block_size, torch.float32, device, padding=0)
    run_decode(case)
    check(case, torch.float32)


def test_decode_in_float16(device):
    case = make_case(DECODE_LENS, 80, 4, 16, torch.float16, device, padding=0)
    run_decode(case)
    check(case, torch.float16)


def test_decode_agrees_with_prefill_of_single_tokens(device):
    case = make_case(DECODE_LENS, 64, 2, 8, torch.float32, device, padding=0)
    run_decode(case)
    decoded = case.out.clone()
    run_prefill(case)
    torch.testing.assert_close(case.out, decoded, atol=1e-6, rtol=1e-6)


def test_strided_query_and_output(device):
    """q and out may be head slices of wider buffers (e.g. a fused qkv projection)."""
    case = make_case(SCENARIOS["chunked_prefill"], 64, 2, 16, torch.float32, device)
    wide_q = torch.zeros(case.q.shape[0], case.q.shape[1] + 3, 64, device=device)
    wide_q[:, 1 : 1 + case.q.shape[1]] = case.q
    wide_out = torch.full_like(wide_q, SENTINEL)
    case.q = wide_q[:, 1 : 1 + case.q.shape[1]]
    case.out = wide_out[:, : case.q.shape[1]]
    run_prefill(case)
    check(case, torch.float32)
    assert (wide_out[:, case.q.shape[1] :] == SENTINEL).all()


def test_no_sequences_leaves_padding_untouched(device):
    q = torch.randn(3, 2, 32, device=device)
    out = torch.full_like(q, SENTINEL)
    cache = torch.randn(4, 8, 2, 32, device=device)
    no_seqs = torch.zeros(0, dtype=torch.int32, device=device)
    block_table = torch.zeros(0, 1, dtype=torch.int32, device=device)
    query_start_loc = torch.zeros(1, dtype=torch.int32, device=device)
    paged_prefill_attention(q, cache, cache, block_table, query_start_loc, no_seqs, 1.0, out)
    paged_decode_attention(q[:0], cache, cache, block_table, no_seqs, 1.0, out[:0])
    assert (out == SENTINEL).all()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: setattr(c, "q", c.q[0]), r"q: expected shape \[num_tokens, num_heads"),
        (
            lambda c: setattr(c, "k_cache", c.k_cache[..., :16]),
            r"k_cache: expected shape \[num_blocks, block_size, num_kv_heads, head_size\]",
        ),
        (lambda c: setattr(c, "v_cache", c.v_cache.half()), r"v_cache: expected dtype"),
        (
            lambda c: setattr(c, "block_table", c.block_table.long()),
            r"block_table: expected dtype in \(int32\)",
        ),
        (
            lambda c: setattr(c, "query_start_loc", c.query_start_loc[:-1]),
            r"query_start_loc: expected shape \[num_seqs \+ 1\] = \(4\)",
        ),
        (lambda c: setattr(c, "out", c.out[:-1]), r"out: expected shape"),
        (
            lambda c: setattr(c, "q", c.q.transpose(1, 2).contiguous().transpose(1, 2)),
            r"q: innermost dimension must have stride 1",
        ),
        (
            lambda c: (
                setattr(c, "k_cache", torch.cat([c.k_cache, c.k_cache], dim=2)),
                setattr(c, "v_cache", torch.cat([c.v_cache, c.v_cache], dim=2)),
            ),
            r"num_kv_heads \(4\) must divide q's num_heads \(6\)",
        ),
    ],
)
def test_prefill_rejects_bad_arguments(device, mutate, message):
    case = make_case(SCENARIOS["prefill"], 32, 3, 8, torch.float32, device)
    mutate(case)
    with pytest.raises(ValueError, match=message):
        run_prefill(case)


def test_decode_rejects_one_query_per_token_mismatch(device):
    case = make_case(DECODE_LENS, 32, 1, 8, torch.float32, device, padding=2)
    with pytest.raises(ValueError, match=r"q: expected shape \[num_seqs, num_heads, head_size\]"):
        run_decode(case)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_size, ratio, block_size", [(128, 4, 16), (80, 8, 32)])
def test_on_the_gpu_with_realistic_lengths(dtype, head_size, ratio, block_size):
    lens = [(1, 700), (300, 0), (1, 63), (129, 400), (1, 1)]
    case = make_case(lens, head_size, ratio, block_size, dtype, "cuda")
    run_prefill(case)
    check(case, dtype)
    decode = make_case([(1, c) for _, c in lens], head_size, ratio, block_size, dtype, "cuda", 0)
    run_decode(decode)
    check(decode, dtype)
