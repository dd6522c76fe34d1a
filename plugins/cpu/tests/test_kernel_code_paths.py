"""Each code path of the CPU plugin's C kernels, built and checked on this machine.

Why: the plugin builds its kernels with ``-march=native``, so a machine runs one path
only (AVX-512, with AVX512-BF16 and AMX where present; AVX2; or the portable loops) and
the others would go untested wherever the tests run.  Here the C sources are also built
for the older x86-64 levels this CPU can run (the baseline, which has the portable code;
x86-64-v3, AVX2; x86-64-v4, AVX-512 without its BF16 and AMX extensions), called through
their C entry points, and held to the same float64 oracles as the plugin's own build.
"""

from __future__ import annotations

import ctypes
import math
import platform
import subprocess
from typing import NamedTuple

import pytest
import torch
from kernel_oracles import (
    assert_matches,
    float64_reference,
    paged_cache,
    shuffled_block_table,
    within_output_rounding,
)

from slotwise_cpu import linear, native

#: name -> (the -march level, the CPU flags it needs, the rows slotwise_small_gemm_rows
#: gives the kernel in float32, bfloat16, float16).
TARGETS = {
    "portable": ("x86-64", set(), [0, 0, 0]),
    "avx2": ("x86-64-v3", {"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}, [16, 16, 16]),
    "avx512": (
        "x86-64-v4",
        {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
        [16, 4, 16],  # bfloat16 past 4 rows only with AVX512-BF16 or AMX, not in this level
    ),
}
DTYPES = list(linear.KERNEL_DTYPES)

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="the levels are x86-64's"
)


class Build(NamedTuple):
    target: str
    library: ctypes.CDLL


@pytest.fixture(scope="module", params=list(TARGETS))
def kernels(request, tmp_path_factory) -> Build:
    """The C kernels built for one level, loaded; skipped where this CPU lacks it."""
    march, needs, _ = TARGETS[request.param]
    missing = needs - set(native._cpu_flags().split())
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(sorted(missing))} for {march}")
    library = tmp_path_factory.mktemp(request.param) / "kernels.so"
    sources = [str(native.SOURCE_DIR / name) for name in native.C_SOURCES]
    flags = [flag for flag in native.C_FLAGS if flag != "-march=native"]
    subprocess.run(
        [native.compiler("CC", "gcc"), *flags, f"-march={march}", "-shared", "-o", str(library),
         *sources],
        check=True,
    )  # fmt: skip
    loaded = ctypes.CDLL(str(library))
    loaded.slotwise_small_gemm.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        *[ctypes.c_int64] * 4, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    loaded.slotwise_paged_decode.argtypes = [
        ctypes.c_void_p, *[ctypes.c_int64] * 2, *[ctypes.c_void_p] * 2, *[ctypes.c_int64] * 4,
        ctypes.c_void_p, *[ctypes.c_int64] * 2, *[ctypes.c_void_p] * 2,
        *[ctypes.c_int64] * 7, ctypes.c_float, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_int64,
    ]  # fmt: skip
    return Build(request.param, loaded)


def test_each_level_gives_the_kernel_the_rows_its_code_is_fast_for(kernels):
    gemm_rows = kernels.library.slotwise_small_gemm_rows
    rows = [gemm_rows(linear.KERNEL_DTYPES[dtype]) for dtype in DTYPES]
    assert rows == TARGETS[kernels.target][2]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# Inner sizes of whole vector steps and not (33, 1: only the tail); outputs that end
# past the last group of four weight rows.
@pytest.mark.parametrize("shape", [(1003, 96), (64, 1376), (7, 33), (5, 1)])
def test_each_level_multiplies_to_float32_rounding(kernels, dtype, shape):
    outputs, inner = shape
    generator = torch.Generator().manual_seed(outputs + inner)
    weight = torch.randn(outputs, inner, generator=generator).to(dtype)
    bias = torch.randn(outputs, generator=generator).to(dtype)
    # Every row count the kernel takes (whichever it is given on this level): one weight
    # row streamed at a time, blocks of weight rows, blocks of x that end on one row.
    for rows in (1, 2, 3, 4, 5, 13, 16):
        x = torch.randn(rows, inner, generator=generator).to(dtype)
        out = torch.empty(rows, outputs, dtype=dtype)
        status = kernels.library.slotwise_small_gemm(
            x.data_ptr(), inner, weight.data_ptr(), bias.data_ptr(), out.data_ptr(), outputs,
            rows, outputs, inner, linear.KERNEL_DTYPES[dtype], 2,
        )  # fmt: skip
        assert status == 0
        expected = x.double() @ weight.double().T + bias.double()
        assert within_output_rounding(out, expected, x, weight), f"{rows} rows"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
# (heads, kv heads, head size, block size): the grouped ratios and head sizes the
# kernel specialises, one the AVX2 loops leave to the portable ones (96 and 256 are
# whole 16s, 20 is not), and tiles that cross blocks.
@pytest.mark.parametrize(
    "layout", [(8, 4, 64, 16), (16, 4, 128, 16), (4, 2, 96, 32), (4, 2, 256, 16), (3, 3, 20, 5)]
)
@pytest.mark.parametrize("order", ["heads-first", "tokens-first"])
def test_each_level_attends_to_float32_rounding(kernels, dtype, layout, order):
    """Blocks as CPU_SDPA lays them out (each head's tokens together) and as the core's
    default shape does (each token's heads together): the kernel reads the strides."""
    heads, kv_heads, head_size, block_size = layout
    lengths = [1, 17, 513, 1200]  # one token, a partial tile, past a 512-token partition
    generator = torch.Generator().manual_seed(heads * head_size + block_size)
    num_blocks = 3 * math.ceil(max(lengths) / block_size) + 8
    kv_cache = paged_cache(num_blocks, block_size, kv_heads, head_size, dtype, generator)
    if order == "tokens-first":  # the same values, stored [2, blocks, block size, heads, D]
        kv_cache = kv_cache.transpose(2, 3).contiguous().transpose(2, 3)
    table = shuffled_block_table(lengths, block_size, num_blocks, generator)
    q = torch.randn(len(lengths), heads, head_size, generator=generator).to(dtype)
    out = torch.empty_like(q)
    keys, values = kv_cache.unbind(0)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    status = kernels.library.slotwise_paged_decode(
        q.data_ptr(), q.stride(0), q.stride(1), keys.data_ptr(), values.data_ptr(), num_blocks,
        keys.stride(0), keys.stride(2), keys.stride(1),
        table.data_ptr(), table.stride(0), table.shape[1], seq_lens.data_ptr(), out.data_ptr(),
        out.stride(0), out.stride(1), len(lengths), heads, kv_heads, head_size, block_size,
        0.37, linear.KERNEL_DTYPES[dtype], 2, None, 0, None, 0, None, 0,
    )  # fmt: skip
    assert status == 0
    assert_matches(out, float64_reference(q, keys, values, table, lengths, 0.37))
