"""The plugin's C kernels: built with the system C compiler on first use, loaded with ctypes.

Why C and not a torch extension: a kernel with no torch headers builds in under a second,
and the only toolchain it needs is the C compiler Inductor already requires on a CPU.
Built libraries are cached per user, keyed by the source, the compiler, its flags and
this CPU's features (the code is built for this CPU, ``-march=native``).  The cache
follows the core's rule for compiled code: a folder or file another user could have
written is never loaded; the library is then built in a private temporary folder.

OpenMP comes from the ``libgomp.so.1`` torch has already loaded (the dynamic linker
reuses a loaded library of the same soname), so the kernels share torch's threads
rather than starting a second pool that would fight it for the cores.
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
from typing import Any

from slotwise.plugin_api import SlotwiseError

logger = logging.getLogger("slotwise")

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")


class KernelBuildError(SlotwiseError, RuntimeError):
    """A C kernel of the CPU plugin could not be built or loaded; the message says why."""


def compiler() -> str:
    """The C compiler: ``$CC``, else ``cc`` on the PATH."""
    name = os.environ.get("CC") or "cc"
    path = shutil.which(name)
    if path is None:
        raise KernelBuildError(
            f"no C compiler {name!r} on the PATH; install one (gcc or clang) or point CC at it"
        )
    return path


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "slotwise" / "cpu-kernels"


@functools.cache
def load(name: str) -> ctypes.CDLL:
    """The library built from ``csrc/<name>.c``, built now unless cached; raises
    ``KernelBuildError`` naming what failed."""
    source = SOURCE_DIR / f"{name}.c"
    cc = compiler()
    headers = b"".join(header.read_bytes() for header in sorted(SOURCE_DIR.glob("*.h")))
    key = _build_key(source.read_bytes() + headers, cc)
    folder = cache_dir()
    if _private_folder(folder):
        library = folder / f"{name}-{key[:24]}.so"
        if not (library.exists() and _private_file(library)):
            _build(cc, source, library)
    else:
        logger.warning(
            "slotwise_cpu: kernel cache %s is missing or writable by other users; "
            "building %s in a private temporary folder instead",
            folder,
            name,
        )
        library = Path(tempfile.mkdtemp(prefix="slotwise-cpu-")) / f"{name}.so"
        _build(cc, source, library)
    try:
        return ctypes.CDLL(str(library))
    except OSError as exc:
        raise KernelBuildError(f"could not load the {name} kernel from {library}: {exc}") from exc


def kernel_function(
    library: str, symbol: str, argtypes: list[Any], unavailable: str
) -> ctypes._CFuncPtr | None:
    """``symbol`` of the library built from ``csrc/<library>.c``, typed; or None, with one
    warning saying what runs instead (``unavailable``) and why, when it cannot be built."""
    try:
        function = getattr(load(library), symbol)
    except KernelBuildError as exc:
        logger.warning("slotwise_cpu: %s because its kernel is unavailable: %s", unavailable, exc)
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def _build_key(source: bytes, cc: str) -> str:
    digest = hashlib.sha256(source)
    for part in (cc, _compiler_version(cc), " ".join(FLAGS), platform.machine(), _cpu_flags()):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def _compiler_version(cc: str) -> str:
    try:
        result = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"C compiler {cc} does not run: {exc}") from exc
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


def _build(cc: str, source: Path, library: Path) -> None:
    """Compile to a temporary name next to ``library``, then rename: a concurrent
    process sees either no library or a whole one."""
    partial = library.with_name(f".{library.name}.{os.getpid()}.tmp")
    command = [cc, *FLAGS, f"-I{SOURCE_DIR}", "-o", str(partial), str(source)]
    logger.info("slotwise_cpu: building %s (%s)", source.name, " ".join(command))
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"could not run {cc} to build {source.name}: {exc}") from exc
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise KernelBuildError(
            f"{cc} failed to build {source.name} (exit {result.returncode}): "
            f"{result.stderr.strip()[-2000:]}"
        )
    os.chmod(partial, 0o700)
    os.replace(partial, library)
