"""The plugin's kernels: one library built on first use, loaded into torch's dispatcher.

``csrc/ops.cpp`` registers the CPU kernels of ``slotwise_cpu::linear`` and
``slotwise_cpu::paged_decode`` around the C kernels ``csrc/small_gemm.c`` and
``csrc/paged_decode.c``.  Why built here rather than shipped: the kernels are built for
this CPU (``-march=native``) against the torch this process runs, with the C and C++
compilers Inductor already needs on a CPU; only torch's few headers for tensors and op
registration are compiled (about 6 s, once per user and torch version).

The library is cached in the core's compile cache root (``SLOTWISE_CACHE_ROOT``, default
``~/.cache/slotwise/compile``) under ``cpu-kernels``, keyed by the sources, the compilers,
their flags, this CPU's features and torch's version, and follows the core's rules for
compiled code: a folder or file another user could have written is never loaded, and
each library has a record of its size and SHA-256 beside it, checked before it is loaded
(a truncated library would crash the process when mapped). Where the cache may not be
used (not trusted, or its disk full or read-only) the library is
built in a private temporary folder, removed once it is loaded. The cache folder is
checked from ``/`` down and used by its real path, and a library is hashed and loaded
through one open descriptor: what is loaded is what was checked.

OpenMP comes from the ``libgomp.so.1`` torch has already loaded, and torch's own
libraries are the ones already in the process (the dynamic linker reuses a loaded
library of the same soname), so the kernels share torch's threads rather than starting
a second pool that would fight it for the cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import torch

from slotwise.plugin_api import (
    CompilationConfig,
    SlotwiseError,
    make_private_directories,
    read_trusted_file,
    untrusted_directory,
    write_atomically,
)

logger = logging.getLogger("slotwise")

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
C_SOURCES = ("small_gemm.c", "paged_decode.c")
CXX_SOURCE = "ops.cpp"
C_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c11")
CXX_FLAGS = ("-O2", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++20")
#: The ops whose CPU kernels the library registers; loading checks that it did.
OPS = ("slotwise_cpu::linear", "slotwise_cpu::paged_decode")
#: The C functions the plugin calls on the library; loading checks that it has them.
SYMBOLS = ("slotwise_cpu_max_kernel_rows",)
#: Seconds one compiler call may take before it is stopped (a build takes 6-15 s).
BUILD_TIMEOUT_S = 180.0
#: Seconds before a compiler call still running is reported.
BUILD_PROGRESS_S = 30.0
CACHE_FOLDER = "cpu-kernels"
#: Where Linux shows a process's open files as paths a library can be loaded from.
FD_FOLDER = "/proc/self/fd"
#: What a compiler says when the disk or the quota is full.
OUT_OF_SPACE_OUTPUT = ("No space left on device", "Disk quota exceeded")
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
    """The kernels' folder in the core's compile cache root.

    Used even with the compile cache off: that switch is about compiled graphs, as
    Triton's kernel cache is not Inductor's; a library is rebuilt only when what it is
    built from changes."""
    return Path(CompilationConfig().resolved_cache_dir) / CACHE_FOLDER


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
    reason = _untrusted_cache(folder)
    if reason is None:
        # Trusted from / down, so nobody else can re-point what its real path goes through.
        library = Path(os.path.realpath(folder)) / f"ops-{key[:24]}.so"
        try:
            return _load_cached(cc, cxx, library)
        except (OSError, OutOfSpaceError) as exc:  # a full disk, a read-only cache
            reason = (
                f"{library.parent} cannot be written ({exc}); free space there or make it writable"
            )
    logger.warning(
        "slotwise_cpu: kernel cache not used: %s; building the kernels in a private "
        "temporary folder, removed once they are loaded",
        reason,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="slotwise-cpu-") as scratch:
            library = Path(scratch) / "ops.so"
            return _open(library, _build(cc, cxx, library))  # stays mapped once deleted
    except (OSError, OutOfSpaceError) as exc:
        raise KernelBuildError(
            f"they cannot be built in the temporary folder {tempfile.gettempdir()} ({exc}); "
            "free space there or point TMPDIR at a folder of yours with room"
        ) from exc


def _untrusted_cache(folder: Path) -> str | None:
    """Why the kernel cache ``folder`` (created private if missing) may not be used."""
    root = str(folder.parent)
    reason = untrusted_directory(str(folder), root)
    if reason is not None:
        return reason
    try:
        make_private_directories(str(folder))
    except OSError as exc:
        return f"{folder} cannot be created ({exc})"
    return untrusted_directory(str(folder), root)  # created meanwhile by someone else?


def _load_cached(cc: str, cxx: str, library: Path) -> ctypes.CDLL:
    """Load the cached ``library`` if it matches its record; else build it again."""
    record = library.with_name(library.name + ".json")
    if library.exists() or record.exists():
        try:
            return _open(library, json.loads(read_trusted_file(str(record))))
        except FileNotFoundError as exc:
            problem = f"has no {Path(exc.filename or record).name}"
        except LibraryMismatch as exc:
            problem = str(exc)
        except (OSError, ValueError) as exc:
            problem = f"cannot be checked ({exc})"
        logger.warning("slotwise_cpu: cached kernel library %s %s; building it again",
                       library, problem)  # fmt: skip
    digest = _build(cc, cxx, library)
    try:
        write_atomically(str(record), json.dumps(digest).encode("utf-8"))
    except OSError as exc:  # costs the next process a rebuild, not this one its kernels
        logger.warning("slotwise_cpu: could not record %s (%s)", library, exc)
    return _open(library, digest)


class LibraryMismatch(Exception):
    """The library on disk is not the one its record describes (or is not trusted)."""


class OutOfSpaceError(KernelBuildError):
    """A compiler ran out of disk space (or quota) while building the kernels."""


def _open(library: Path, expected: object) -> ctypes.CDLL:
    """Load ``library`` when it is a private file of yours whose size and SHA-256 are
    ``expected`` (the record written at build); any library that is not the plugin's
    kernels is refused.

    The file is checked, hashed and loaded through one open descriptor
    (``/proc/self/fd/N``), so the bytes loaded are the bytes hashed even if the path is
    replaced meanwhile: a truncated library would crash the process when mapped.
    """
    descriptor = os.open(library, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    try:
        problem = _untrusted_library(os.fstat(descriptor))
        content = b"" if problem else _read_all(descriptor)
        problem = problem or _differs(content, expected)
        if problem is not None:
            raise LibraryMismatch(problem)
        handle = _dlopen(library, descriptor, content)
    finally:
        os.close(descriptor)
    absent = [name for name in SYMBOLS if not hasattr(handle, name)]
    try:
        missing = [
            op for op in OPS if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
        ]
    except RuntimeError as exc:  # an op not even declared: not this plugin's library
        raise KernelBuildError(f"{library} is not the plugin's kernels: {exc}") from exc
    if missing or absent:
        raise KernelBuildError(
            f"{library} is not the plugin's kernels: it registered no CPU kernel for "
            f"{missing} and lacks the functions {absent}"
        )
    return handle


def _untrusted_library(status: os.stat_result) -> str | None:
    """The core's rule for cache entries, on the open library: a regular file of yours
    (or root's) that group and others cannot write."""
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if status.st_uid not in (os.getuid(), 0):
        return f"is owned by uid {status.st_uid}, not by you (uid {os.getuid()})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def _read_all(descriptor: int) -> bytes:
    chunks = []
    while chunk := os.read(descriptor, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _differs(content: bytes, expected: object) -> str | None:
    """How ``content`` differs from the record ``expected``, or None when it matches."""
    if not isinstance(expected, dict):
        return "has an unreadable record"
    if expected.get("size") != len(content):
        return f"is {len(content)} bytes, not the {expected.get('size')} recorded at build"
    if expected.get("sha256") != hashlib.sha256(content).hexdigest():
        return "does not match the SHA-256 recorded at build"
    return None


def _dlopen(library: Path, descriptor: int, content: bytes) -> ctypes.CDLL:
    """The library open at ``descriptor`` loaded (its static initialisers register the
    kernels): through ``/proc/self/fd``, or where there is none, from a private copy of
    the checked ``content``."""
    try:
        if os.path.isdir(FD_FOLDER):
            return ctypes.CDLL(f"{FD_FOLDER}/{descriptor}")
        with tempfile.TemporaryDirectory(prefix="slotwise-cpu-") as private:  # mode 0700
            copy = Path(private) / library.name
            copy.write_bytes(content)
            return ctypes.CDLL(str(copy))
    except OSError as exc:
        raise KernelBuildError(f"could not load the kernels from {library}: {exc}") from exc


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


def _build(cc: str, cxx: str, library: Path) -> dict[str, object]:
    """Compile the C kernels, then link them with the op registrations, in a private
    folder next to ``library``; then rename: a concurrent process sees either no library
    or a whole one. Returns the library's size and SHA-256."""
    include, lib = _torch_dirs()
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    logger.info(
        "slotwise_cpu: building the plugin's kernels for this CPU and torch %s into %s "
        "(once; about 15 s, each compiler call stopped after %g s)",
        torch.__version__,
        library,
        BUILD_TIMEOUT_S,
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
        content = partial.read_bytes()
        os.replace(partial, library)
    return {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}


def _run(command: list[str], source: str) -> None:
    """Run one compiler call, stopped (with all it started) after BUILD_TIMEOUT_S."""
    logger.debug("slotwise_cpu: building %s: %s", source, " ".join(command))
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, stopped as a whole
        )
    except OSError as exc:
        raise KernelBuildError(f"could not run {command[0]} to build {source}: {exc}") from exc
    try:
        try:
            _, stderr = process.communicate(timeout=BUILD_PROGRESS_S)
        except subprocess.TimeoutExpired:
            logger.info("slotwise_cpu: still building %s after %g s (stopped at %g s)",
                        source, BUILD_PROGRESS_S, BUILD_TIMEOUT_S)  # fmt: skip
            _, stderr = process.communicate(timeout=BUILD_TIMEOUT_S - BUILD_PROGRESS_S)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise KernelBuildError(
            f"{command[0]} did not finish building {source} within {BUILD_TIMEOUT_S:g} s and "
            "was stopped; check the compiler (CC, CXX) or the machine's load"
        ) from None
    except BaseException:  # Ctrl-C: no compiler is left running
        _stop(process)
        raise
    if process.returncode != 0 and any(said in stderr for said in OUT_OF_SPACE_OUTPUT):
        raise OutOfSpaceError(f"{command[0]} ran out of disk space building {source}")
    if process.returncode != 0:
        raise KernelBuildError(
            f"{command[0]} failed to build {source} (exit {process.returncode}): "
            f"{stderr.strip()[-2000:]}"
        )


def _stop(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
