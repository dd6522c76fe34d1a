"""Building and caching the CPU plugin's C kernels (``slotwise_cpu.native``).

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

#: Loads the attention kernel and runs one decode through the CPU backend, checking it
#: against SDPA on a dense copy; prints which path ran.
DECODE = """
import logging, sys
import torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from slotwise.attention import AttentionMetadataBuilder
from slotwise_cpu import paged_decode
from slotwise_cpu.attention import CpuSdpaImpl

torch.manual_seed(0)
impl = CpuSdpaImpl(4, 16, 0.25, 2)
kv_cache = torch.randn(2, 4, 16, 2, 16)
metadata = AttentionMetadataBuilder(16).build([1], [20], [[2, 0]])
q, k, v = torch.randn(1, 4, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
out = torch.empty_like(q)
impl.forward(None, q, k, v, kv_cache, metadata, out)
keys = kv_cache[0][[2, 0]].reshape(32, 2, 16)[:21].repeat_interleave(2, 1).transpose(0, 1)
values = kv_cache[1][[2, 0]].reshape(32, 2, 16)[:21].repeat_interleave(2, 1).transpose(0, 1)
expected = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(0, 1)[:, :, None], keys[:, None], values[:, None], scale=0.25)[:, :, 0]
torch.testing.assert_close(out, expected.transpose(0, 1))
print("kernel" if paged_decode.kernel() is not None else "gathered")
"""


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


def test_a_kernel_is_built_once_and_then_loaded_from_the_cache(tmp_path):
    first = run(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["kernel"] and "building paged_decode.c" in first.stderr
    (library,) = kernel_folder(tmp_path).glob("paged_decode-*.so")
    assert library.stat().st_mode & 0o777 == 0o700
    second = run(tmp_path)
    assert second.stdout.split() == ["kernel"] and "building" not in second.stderr


def test_without_a_c_compiler_decodes_gather_and_a_warning_says_why(tmp_path):
    result = run(tmp_path, CC="no-such-compiler-cc")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gathered"]
    assert "decode attention gathers each request's cache blocks" in result.stderr
    assert "no C compiler 'no-such-compiler-cc' on the PATH" in result.stderr


def test_a_cache_folder_other_users_can_write_is_not_used(tmp_path):
    folder = kernel_folder(tmp_path)
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["kernel"]
    assert "writable by other users; building paged_decode in a private temporary" in (
        result.stderr
    )
    assert not list(folder.iterdir())


def test_a_cached_library_other_users_can_write_is_rebuilt_not_loaded(tmp_path):
    assert run(tmp_path).returncode == 0
    (library,) = kernel_folder(tmp_path).glob("paged_decode-*.so")
    library.write_bytes(b"not a library")  # what another user could have put there
    os.chmod(library, 0o666)
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["kernel"] and "building paged_decode.c" in result.stderr
    assert library.stat().st_mode & 0o777 == 0o700
