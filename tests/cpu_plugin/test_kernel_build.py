"""Building and caching the CPU plugin's kernels (``slotwise_cpu.native``).

Each case runs in a fresh process (the built library is loaded once per process) with
its own cache folder, so nothing here touches the user's cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

pytestmark = pytest.mark.slow  # each case starts a Python process that imports torch

#: Calls the linear op first (in a fresh process its Python stand-in loads the kernels and
#: calls the op again), checking it against float64 (kernel) or F.linear exactly (torch);
#: then runs one decode through the CPU backend, checking it against SDPA on a dense
#: copy; prints which paths ran.
DECODE = """
import logging, sys
import torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from slotwise.attention import AttentionMetadataBuilder
from slotwise_cpu import linear, native, paged_decode
from slotwise_cpu.attention import CpuSdpaImpl

torch.manual_seed(0)
assert not torch._C._dispatch_has_kernel_for_dispatch_key(linear.LINEAR_OP, "CPU")
x, weight = torch.randn(2, 64).bfloat16(), torch.randn(48, 64).bfloat16()
product = linear.linear_op(x, weight, None)
built = native.load_kernels() is not None
assert built == torch._C._dispatch_has_kernel_for_dispatch_key(linear.LINEAR_OP, "CPU")
if linear.runs_kernel(torch.bfloat16):  # built, and the CPU has the kernel's vector code
    exact = x.double() @ weight.double().T
    assert ((product.double() - exact).abs() <= 2 ** -8 * exact.abs() + 1e-4).all()
else:
    assert torch.equal(product, torch.nn.functional.linear(x, weight))
impl = CpuSdpaImpl(4, 16, 0.25, 2)
kv_cache = torch.randn(2, 4, 2, 16, 16)  # head-major blocks
metadata = AttentionMetadataBuilder(16).build([1], [20], [[2, 0]])
q, k, v = torch.randn(1, 4, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
out = torch.empty_like(q)
impl.forward(None, q, k, v, kv_cache, metadata, out)
tokens = kv_cache[:, [2, 0]].transpose(2, 3).reshape(2, 32, 2, 16)[:, :21]  # [2, 21, 2, 16]
keys, values = tokens.repeat_interleave(2, 2).transpose(1, 2).unbind(0)
expected = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(0, 1)[:, :, None], keys[:, None], values[:, None], scale=0.25)[:, :, 0]
torch.testing.assert_close(out, expected.transpose(0, 1))
if not paged_decode.available():  # called anyway, the op says why it cannot run
    try:
        paged_decode.paged_decode_op(q, kv_cache, metadata.block_table, metadata.seq_lens, out, 1.0)
    except RuntimeError as error:
        assert "needs the CPU plugin's kernels, which could not be built" in str(error)
    else:
        raise AssertionError("paged_decode ran without its kernel")
print("kernel" if paged_decode.available() else "gathered", "small-gemm" if built else "torch-gemm")
"""
#: What the script prints with and without the kernels.
WITH_KERNELS, WITHOUT_KERNELS = ["kernel", "small-gemm"], ["gathered", "torch-gemm"]
#: The warning that says what runs instead.
INSTEAD = "linear layers run torch's GEMM, and decode attention gathers each request's cache"


def run(cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DECODE],
        capture_output=True,
        text=True,
        env=clean_env(XDG_CACHE_HOME=str(cache), **env),
        timeout=300,
    )


def kernel_folder(cache: Path) -> Path:
    return cache / "slotwise" / "cpu-kernels"


def test_the_kernels_are_built_once_loaded_from_the_cache_and_rebuilt_if_tampered(tmp_path):
    first = run(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == WITH_KERNELS
    assert "building the plugin's kernels" in first.stderr
    (library,) = kernel_folder(tmp_path).glob("ops-*.so")
    assert library.stat().st_mode & 0o777 == 0o700
    second = run(tmp_path)
    assert second.stdout.split() == WITH_KERNELS and "building" not in second.stderr
    library.write_bytes(b"not a library")  # what another user could have put there
    os.chmod(library, 0o666)
    third = run(tmp_path)
    assert third.returncode == 0, third.stderr
    assert third.stdout.split() == WITH_KERNELS and "building the plugin's kernels" in third.stderr
    assert library.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "env, reason",
    [
        ({"CC": "no-such-compiler-cc"}, "no C compiler 'no-such-compiler-cc' on the PATH"),
        ({"CXX": "no-such-compiler-c++"}, "no C++ compiler 'no-such-compiler-c++' on the PATH"),
        ({"CXX": "false"}, "failed to build ops.cpp (exit 1)"),
    ],
    ids=["no-c-compiler", "no-c++-compiler", "c++-compiler-fails"],
)
def test_without_the_kernels_torch_runs_instead_and_a_warning_says_why(tmp_path, env, reason):
    result = run(tmp_path, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITHOUT_KERNELS
    assert INSTEAD in result.stderr and reason in result.stderr
    assert result.stderr.count(INSTEAD) == 1  # once per process, not per call
    assert not list(kernel_folder(tmp_path).glob("ops-*.so"))


def test_a_cache_folder_other_users_can_write_is_not_used(tmp_path):
    folder = kernel_folder(tmp_path)
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITH_KERNELS
    assert "writable by other users; building the kernels in a private temporary" in (result.stderr)
    assert not list(folder.iterdir())
