"""The plugin's kernels: one library built on first use, loaded into torch's dispatcher.

``csrc/ops.cpp`` registers the CPU kernels of ``slotwise_cpu::linear`` and
``slotwise_cpu::paged_decode`` around the C kernels ``csrc/small_gemm.c`` and
``csrc/paged_decode.c``.  Why built here rather than shipped: the kernels are built for
this CPU (``-march=native``) against the torch this process runs, with the C and C++
compilers Inductor already needs on a CPU; only torch's few headers for tensors and op
registration are compiled (about 6 s, once per user and torch version).

The library is cached per user, keyed by the sources, the compilers, their flags, this
CPU's features and torch's version.  The cache follows the core's rule for compiled
code: a folder or file another user could have written is never loaded; the library is
then built in a private temporary folder.

OpenMP comes from the ``libgomp.so.1`` torch has already loaded, and torch's own
libraries are the ones already in the process (the dynamic linker reuses a loaded
library of the same soname), so the kernels share torch's threads rather than starting
a second pool that would fight it for the cores.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import torch

from slotwise.plugin_api import SlotwiseError

logger = logging.getLogger("slotwise")

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
C_SOURCES = ("small_gemm.c", "paged_decode.c")
CXX_SOURCE = "ops.cpp"
C_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c11")
CXX_FLAGS = ("-O2", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++20")
#: The ops whose CPU kernels the library registers; loading checks that it did.
OPS = ("slotwise_cpu::linear", "slotwise_cpu::paged_decode")
#: Says what runs instead when the library cannot be had.
UNAVAILABLE = (
    "linear layers run torch's GEMM, and decode attention gathers each request's cache "
    "blocks into a dense copy (slower for long contexts)"
)


class KernelBuildError(SlotwiseError, RuntimeError):
    """The CPU plugin's kernels could not be built or loaded; the message says why."""


def compiler(variable: str, default: str) -> str:
    """The compiler named by ``$variable`` (``CC``, ``CXX``), else ``default`` on the PATH."""
    name = os.environ.get(variable) or default
    path = shutil.which(name)
    if path is None:
        kind = "C++" if variable == "CXX" else "C"
        raise KernelBuildError(
            f"no {kind} compiler {name!r} on the PATH; install one (gcc and g++, or clang) "
            f"or point {variable} at it"
        )
    return path


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "slotwise" / "cpu-kernels"


@functools.cache
def load_kernels() -> ctypes.CDLL | None:
    """The kernels library, built now unless cached, with the ops' CPU kernels registered;
    or None, after one warning naming what runs instead and why, when it cannot be had."""
    try:
        return _load()
    except KernelBuildError as exc:
        logger.warning("slotwise_cpu: %s because the plugin's kernels are unavailable: %s",
                       UNAVAILABLE, exc)  # fmt: skip
        return None


def _load() -> ctypes.CDLL:
    cc, cxx = compiler("CC", "cc"), compiler("CXX", "c++")
    key = _build_key(cc, cxx)
    folder = cache_dir()
    if _private_folder(folder):
        library = folder / f"ops-{key[:24]}.so"
        if not (library.exists() and _private_file(library)):
            _build(cc, cxx, library)
    else:
        logger.warning(
            "slotwise_cpu: kernel cache %s is missing or writable by other users; "
            "building the kernels in a private temporary folder instead",
            folder,
        )
        library = Path(tempfile.mkdtemp(prefix="slotwise-cpu-")) / "ops.so"
        _build(cc, cxx, library)
    try:
        handle = ctypes.CDLL(str(library))  # its static initialisers register the kernels
    except OSError as exc:
        raise KernelBuildError(f"could not load the kernels from {library}: {exc}") from exc
    missing = [op for op in OPS if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")]
    if missing:
        raise KernelBuildError(f"{library} loaded but registered no CPU kernel for {missing}")
    return handle


def _torch_dirs() -> tuple[Path, Path]:
    """torch's headers and libraries, as its wheel lays them out."""
    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


def _build_key(cc: str, cxx: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".c", ".cpp", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    parts = (
        cc, _compiler_version(cc), cxx, _compiler_version(cxx), " ".join(C_FLAGS),
        " ".join(CXX_FLAGS), platform.machine(), _cpu_flags(), torch.__version__,
        str(torch.version.git_version), str(torch._C._GLIBCXX_USE_CXX11_ABI),
    )  # fmt: skip
    for part in parts:
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def _compiler_version(path: str) -> str:
    try:
        result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"compiler {path} does not run: {exc}") from exc
    return result.stdout


def _cpu_flags() -> str:
    """What ``-march=native`` depends on; another CPU gets its own build."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _private_folder(folder: Path) -> bool:
    """``folder`` exists (created if need be) and only this user can write to it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _private_file(path: Path) -> bool:
    info = path.lstat()
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _build(cc: str, cxx: str, library: Path) -> None:
    """Compile the C kernels, then link them with the op registrations, in a private
    folder next to ``library``; then rename: a concurrent process sees either no library
    or a whole one."""
    include, lib = _torch_dirs()
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    logger.info(
        "slotwise_cpu: building the plugin's kernels for this CPU and torch %s into %s "
        "(once; about 15 s)",
        torch.__version__,
        library,
    )
    with tempfile.TemporaryDirectory(dir=library.parent, prefix=".build-") as scratch:
        objects = []
        for name in C_SOURCES:
            obj = str(Path(scratch) / f"{name}.o")
            _run([cc, *C_FLAGS, f"-I{SOURCE_DIR}", "-c", "-o", obj, str(SOURCE_DIR / name)], name)
            objects.append(obj)
        partial = Path(scratch) / library.name
        command = [
            cxx, *CXX_FLAGS, abi, f"-I{include}", "-o", str(partial),
            str(SOURCE_DIR / CXX_SOURCE), *objects, f"-L{lib}", "-ltorch_cpu", "-lc10",
        ]  # fmt: skip
        _run(command, CXX_SOURCE)
        os.chmod(partial, 0o700)
        os.replace(partial, library)


def _run(command: list[str], source: str) -> None:
    logger.debug("slotwise_cpu: building %s: %s", source, " ".join(command))
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"could not run {command[0]} to build {source}: {exc}") from exc
    if result.returncode != 0:
        raise KernelBuildError(
            f"{command[0]} failed to build {source} (exit {result.returncode}): "
            f"{result.stderr.strip()[-2000:]}"
        )
