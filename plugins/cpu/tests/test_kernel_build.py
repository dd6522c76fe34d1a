"""Building and caching the CPU plugin's kernels (``slotwise_cpu.native``).

Each case runs in a fresh process (the built library is loaded once per process) with
its own cache root and temporary folder, so nothing here touches the user's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


#: A uid other than the tests' (they run as root): the owner of another user's folders.
OTHER_UID = 1000


def run(cache: Path, prelude: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """DECODE in a fresh process, without this one's ``SLOTWISE_*`` variables, whose compile
    cache root is ``cache`` and whose temporary folder is ``cache``'s sibling ``tmp`` (to
    see what is left there)."""
    temporary = cache.parent / "tmp"
    temporary.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    environ.update(SLOTWISE_CACHE_ROOT=str(cache), TMPDIR=str(temporary), **env)
    return subprocess.run(
        [sys.executable, "-c", prelude + DECODE],
        capture_output=True,
        text=True,
        env=environ,
        timeout=600,
    )


def kernel_folder(cache: Path) -> Path:
    return cache / "cpu-kernels"


def leftovers(cache: Path) -> list[str]:
    """Build folders left behind: in the kernel cache and the temporary folder."""
    folders = [kernel_folder(cache), cache.parent / "tmp"]
    return [entry.name for folder in folders if folder.exists() for entry in folder.iterdir()
            if entry.name.startswith((".build-", "slotwise-cpu-"))]  # fmt: skip


def record(library: Path) -> dict[str, object]:
    return json.loads(library.with_name(library.name + ".json").read_text())


def test_the_kernels_are_built_once_loaded_from_the_cache_and_rebuilt_if_tampered(tmp_path):
    cache = tmp_path / "root"
    first = run(cache)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == WITH_KERNELS
    assert "building the plugin's kernels" in first.stderr
    (library,) = kernel_folder(cache).glob("ops-*.so")
    assert library.stat().st_mode & 0o777 == 0o700
    content = library.read_bytes()
    assert record(library) == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    second = run(cache)
    assert second.stdout.split() == WITH_KERNELS and "building" not in second.stderr
    # The compile cache off is about compiled graphs: the kernels still come from the cache.
    uncached_graphs = run(cache, SLOTWISE_DISABLE_COMPILE_CACHE="1")
    assert uncached_graphs.stdout.split() == WITH_KERNELS, uncached_graphs.stderr
    assert "building" not in uncached_graphs.stderr
    # Truncated, still yours and private: mapping it would crash the process (SIGBUS).
    library.write_bytes(content[: len(content) // 2])
    third = run(cache)
    assert third.returncode == 0, third.stderr
    assert third.stdout.split() == WITH_KERNELS and "building the plugin's kernels" in third.stderr
    assert f"is {len(content) // 2} bytes, not the {len(content)} recorded at build" in third.stderr
    library.write_bytes(b"not a library")  # what another user could have put there
    os.chmod(library, 0o666)
    fourth = run(cache)
    assert fourth.returncode == 0, fourth.stderr
    assert fourth.stdout.split() == WITH_KERNELS
    assert "writable by group or others" in fourth.stderr
    assert library.stat().st_mode & 0o777 == 0o700
    assert not leftovers(cache)


def test_a_library_that_is_not_the_kernels_falls_back_with_one_warning(tmp_path):
    """A foreign library that matches its record (say, a record rewritten with it) loads
    but registers nothing: torch's code runs, after one warning."""
    from slotwise_cpu import native

    cache = tmp_path / "root"
    folder = kernel_folder(cache)
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    source = tmp_path / "foreign.c"
    source.write_text("int foreign(void) { return 1; }\n")
    key = native._build_key(native.compiler("CC", "cc"), native.compiler("CXX", "c++"))
    library = folder / f"ops-{key[:24]}.so"
    subprocess.run([native.compiler("CC", "cc"), "-shared", "-fPIC", "-o", str(library),
                    str(source)], check=True)  # fmt: skip
    os.chmod(library, 0o700)
    content = library.read_bytes()
    facts = {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    library.with_name(library.name + ".json").write_text(json.dumps(facts))
    result = run(cache)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITHOUT_KERNELS
    assert result.stderr.count(INSTEAD) == 1
    assert "is not the plugin's kernels" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_compiler_that_hangs_is_stopped_and_torch_runs_instead(tmp_path):
    pid_file = tmp_path / "compiler.pid"
    hanging = tmp_path / "hanging-cc"
    hanging.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo hanging 1.0; exit 0; fi\n'
        f"echo $$ > {pid_file}\nexec sleep 600\n"
    )
    hanging.chmod(0o755)
    prelude = "import slotwise_cpu.native as n\nn.BUILD_TIMEOUT_S, n.BUILD_PROGRESS_S = 4, 1\n"
    result = run(tmp_path / "root", prelude, CC=str(hanging), CXX=str(hanging))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITHOUT_KERNELS
    assert "each compiler call stopped after 4 s" in result.stderr  # said before it waits
    assert "still building small_gemm.c after 1 s" in result.stderr  # its first call
    assert "did not finish building small_gemm.c within 4 s and was stopped" in result.stderr
    assert result.stderr.count(INSTEAD) == 1
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists()  # no compiler left
    assert not leftovers(tmp_path / "root")


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
    result = run(tmp_path / "root", **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITHOUT_KERNELS
    assert INSTEAD in result.stderr and reason in result.stderr
    assert result.stderr.count(INSTEAD) == 1  # once per process, not per call
    assert not list(kernel_folder(tmp_path / "root").glob("ops-*.so"))
    assert not leftovers(tmp_path / "root")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
@pytest.mark.parametrize("owner", ["writable-folder", "foreign-root"])
def test_a_cache_other_users_could_write_is_not_used_and_nothing_is_left(tmp_path, owner):
    cache = tmp_path / "root"
    folder = kernel_folder(cache)
    folder.mkdir(parents=True)
    if owner == "writable-folder":
        os.chmod(folder, 0o777)
    else:
        os.chmod(cache, 0o755)
        os.chown(cache, OTHER_UID, OTHER_UID)
    result = run(cache)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITH_KERNELS
    assert "kernel cache not used" in result.stderr
    assert "building the kernels in a private temporary folder" in result.stderr
    assert not list(folder.iterdir())  # nothing written there
    assert not leftovers(cache)  # and the temporary folder is gone


#: Between the library's check and its load, its path gets another file, as a rebuild in
#: another process would do (or anyone who could rename files into the folder).
SWAP_BEFORE_LOAD = """
import ctypes, os
from slotwise_cpu import native
load = ctypes.CDLL

def swap_then_load(name, *args, **kwargs):
    if not (str(name).startswith("/proc/self/fd/") or os.path.basename(name).startswith("ops-")):
        return load(name, *args, **kwargs)  # not the kernels
    ctypes.CDLL = load
    for library in native.cache_dir().glob("ops-*.so"):
        swapped = library.with_name("swapped")
        swapped.write_bytes(b"not the library that was checked")
        swapped.chmod(0o700)
        os.replace(swapped, library)
    return load(name, *args, **kwargs)

ctypes.CDLL = swap_then_load
"""


@pytest.mark.parametrize("loader", ["open-file", "private-copy"])
def test_the_library_loaded_is_the_library_checked(tmp_path, loader):
    prelude = SWAP_BEFORE_LOAD
    if loader == "private-copy":  # a system without /proc/self/fd
        prelude += "native.FD_FOLDER = '/no/such/folder'\n"
    result = run(tmp_path / "root", prelude)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == WITH_KERNELS
    assert INSTEAD not in result.stderr
    (library,) = kernel_folder(tmp_path / "root").glob("ops-*.so")
    assert library.read_bytes() == b"not the library that was checked"  # swapped indeed
    assert not leftovers(tmp_path / "root")


@pytest.mark.skipif(os.getuid() != 0, reason="mounting a small disk needs root")
def test_a_full_kernel_cache_builds_in_a_private_folder_with_one_warning(tmp_path):
    cache = tmp_path / "root"
    cache.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=700", "tmpfs",
                              str(cache)], capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        result = run(cache)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == WITH_KERNELS
        assert f"kernel cache not used: {kernel_folder(cache)} cannot be written" in result.stderr
        assert "ran out of disk space" in result.stderr
        assert result.stderr.count("kernel cache not used") == 1
        assert "Traceback" not in result.stderr
        assert not leftovers(cache)
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=True)
