"""Inductor's caches kept where slotwise trusts them: beside slotwise's own, or private.

slotwise's entries hold a piece's generated code, not the kernels it builds, so Inductor's
folder must outlive a reboot: it goes to ``<cache root>/inductor/<machine>`` unless
``TORCHINDUCTOR_CACHE_DIR`` is set.  Inductor runs the code it finds there, so it is only
handed a real path :mod:`slotwise.cache_permissions` trusts (the same for
``TRITON_CACHE_DIR``), and a folder on a disk without room is not used; otherwise its
caches go to a private folder of this process, removed at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile

from slotwise.cache_permissions import (
    describe_write_failure,
    disk_room,
    make_private_directories,
    out_of_space,
    resolve_trusted_directory,
)
from slotwise.compilation.cache.cache_key import folder_key, inductor_folder_factors
from slotwise.errors import SlotwiseError

logger = logging.getLogger(__name__)

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
INDUCTOR_FOLDER = "inductor"
#: What a process using the private folder loses, said in its warning.
UNCACHED = (
    "Inductor's generated code, FX graphs, C++/Triton kernels and autotuning results are "
    "cached in a private temporary folder of this process only, removed at exit: nothing "
    "compiled now is kept for the next process"
)
#: Room Inductor needs to compile a model: its generated code, graphs and kernels.
MIN_FREE_MIB = 64
#: Inodes Inductor needs to compile a model (a few files per kernel and graph).
MIN_FREE_INODES = 1024
#: Room below which Inductor's precompiled C++ headers (about 150 MiB a set) stay off.
HEADERS_FREE_MIB = 512
#: The fixes the warnings name, for a folder refused and for one on a full disk.
FIX_IT = f"fix that folder or set {INDUCTOR_CACHE_ENV} or SLOTWISE_CACHE_ROOT to a folder of yours"
FREE_IT = (
    f"free space there or set {INDUCTOR_CACHE_ENV} or SLOTWISE_CACHE_ROOT to a folder of yours "
    "on a disk with room"
)
#: What a compiler says when the disk or the quota is full.
_OUT_OF_SPACE_OUTPUT = ("No space left on device", "Disk quota exceeded")

#: The folder this process handed Inductor, once placed.
_placed: str | None = None
#: This process's private folder for Inductor, once made.
_private: str | None = None


class CacheDiskFullError(SlotwiseError, RuntimeError):
    """Inductor has no folder with room to compile into; the message says where and the fix."""


def place_inductor_cache(cache_root: str | None) -> str:
    """Point Inductor's caches at a folder slotwise trusts; the folder they will use.

    ``cache_root`` None (the compile cache is off) means the private folder.  Runs before
    Dynamo is imported, which sets the variable to Inductor's default.
    """
    chosen = os.environ.get(INDUCTOR_CACHE_ENV)
    if chosen and chosen == _placed:
        return chosen  # placed here earlier in this process
    if chosen:
        folder, problem = _usable_folder(chosen, chosen)
        if problem is None:
            _keep_chosen(folder, chosen)
        else:
            folder = _use_private_folder(f"{INDUCTOR_CACHE_ENV}={chosen} {problem}")
    elif cache_root is None:
        folder = _use_private_folder("the compile cache is off", fix=None)
    else:
        root = os.path.abspath(os.path.expanduser(cache_root))
        folder, problem = _usable_folder(os.path.join(root, INDUCTOR_FOLDER, _machine_key()), root)
        if problem is None:
            logger.info(
                "Inductor's cache is %s, beside slotwise's (set %s to choose another)",
                folder,
                INDUCTOR_CACHE_ENV,
            )
        else:
            folder = _use_private_folder(f"the compile cache root {problem}")
    crowded = _too_full(folder) if folder != _private else None
    if crowded is not None:
        folder = _use_private_folder(f"Inductor's cache {folder} is not used: {crowded}", FREE_IT)
    _check_room_of_private(folder)
    return _place(folder)


def compile_ran_out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it, a compiler's output included) is a full disk
    or quota."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and out_of_space(current):
            return True
        if any(said in str(current) for said in _OUT_OF_SPACE_OUTPUT):
            return True
        inner = getattr(current, "inner_exception", None)  # Dynamo's and Inductor's wrappers
        pending += [current.__cause__, current.__context__]
        if isinstance(inner, BaseException):
            pending.append(inner)
    return False


def move_off_full_disk() -> str:
    """After a compile ran out of space in Inductor's folder: move Inductor's caches to
    this process's private folder, precompiled headers off, with one warning; the folder."""
    full = os.environ.get(INDUCTOR_CACHE_ENV, "")
    if full and full == _private:
        raise CacheDiskFullError(_no_room_message(full, f"it ran out of space, {_room(full)}"))
    folder = _use_private_folder(
        f"a compile ran out of space in Inductor's cache {full} ({_room(full)})", FREE_IT
    )
    _check_room_of_private(folder)
    _place(folder)
    _switch_off_precompiled_headers()
    from torch._inductor.utils import clear_caches  # Inductor is compiling: imported already

    clear_caches()  # nothing remembered of the full folder
    return folder


def place_precompiled_headers() -> None:
    """Keep Inductor's precompiled C++ headers in its cache folder too (Inductor writes them
    under its shared default folder whatever the variable says), or switch them off where
    that folder's disk has too little room or this torch keeps them elsewhere."""
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = cache_dir()
    if not (hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR")):
        logger.debug("no Inductor header folder known in this torch; headers are not precompiled")
        _switch_off_precompiled_headers()
        return
    room = disk_room(folder)
    if room is not None and room[0] < HEADERS_FREE_MIB:
        logger.warning(
            "Inductor's precompiled C++ headers (about 150 MiB) are switched off: the disk "
            "holding %s has %d MiB free, less than %d MiB; C++ kernels compile slower. Free "
            "space there, or set %s or SLOTWISE_CACHE_ROOT to a folder on a disk with room",
            folder,
            room[0],
            HEADERS_FREE_MIB,
            INDUCTOR_CACHE_ENV,
        )
        _switch_off_precompiled_headers()
        return
    headers = os.path.join(folder, "precompiled_headers")
    codecache._HEADER_DIR = headers
    codecache._HEADER_LOCK_DIR = os.path.join(headers, "locks")


def _usable_folder(path: str, root: str) -> tuple[str, str | None]:
    """The real path of ``path`` (inside the cache ``root``), created private, and why it
    may not be used (None when it may); checked before creating it and again after."""
    real, reason = resolve_trusted_directory(path, root)
    if reason is not None:
        return real, f"is not trusted: {reason}"
    try:
        make_private_directories(real)
    except OSError as err:
        return real, f"cannot be used: {describe_write_failure(real, err)}"
    real, reason = resolve_trusted_directory(path, root)
    return real, None if reason is None else f"is not trusted: {reason}"


def _place(folder: str) -> str:
    global _placed
    os.environ[INDUCTOR_CACHE_ENV] = _placed = folder
    _place_triton_cache(folder)
    return folder


def _keep_chosen(folder: str, chosen: str) -> None:
    if not _under_temporary_folder(folder):
        logger.debug("Inductor's cache stays in %s (%s is set)", folder, INDUCTOR_CACHE_ENV)
    elif "torch._dynamo" in sys.modules and chosen == _inductors_default():
        logger.info(
            "Inductor's cache stays in %s, its default under the system's temporary folder: "
            "Dynamo was imported before slotwise compiled, which chose it. Its compiled "
            "kernels will not outlive a reboot; set %s to keep them",
            folder,
            INDUCTOR_CACHE_ENV,
        )
    else:
        logger.info(
            "Inductor's cache stays in %s (%s is set), under the system's temporary folder: "
            "its compiled kernels will not outlive a reboot",
            folder,
            INDUCTOR_CACHE_ENV,
        )


def _place_triton_cache(inductor_folder: str) -> None:
    """``TRITON_CACHE_DIR`` as its checked real path, or, where it may not be used, a
    folder inside Inductor's (where Inductor puts Triton's cache when it is unset)."""
    chosen = os.environ.get(TRITON_CACHE_ENV)
    if not chosen:
        return
    real, problem = _usable_folder(chosen, chosen)
    if problem is None:
        os.environ[TRITON_CACHE_ENV] = real
        return
    folder = os.path.join(inductor_folder, "triton")
    logger.warning(
        "%s=%s %s; Triton's kernels are cached in %s instead",
        TRITON_CACHE_ENV,
        chosen,
        problem,
        folder,
    )
    os.environ[TRITON_CACHE_ENV] = folder


def _use_private_folder(why: str, fix: str | None = FIX_IT) -> str:
    """The private folder, after a warning saying ``why`` and the ``fix`` (None: an INFO
    line, for a choice the user made)."""
    folder = _private_folder()
    if fix is not None:
        logger.warning("%s; %s (%s). To keep them, %s", why, UNCACHED, folder, fix)
    else:
        logger.info("%s; %s (%s)", why, UNCACHED, folder)
    return folder


def _private_folder() -> str:
    """A new folder only this user can enter (0700), made once per process and removed
    at exit: nobody else can have planted anything in it."""
    global _private
    if _private is None:
        try:
            made = tempfile.mkdtemp(prefix="slotwise-inductor-")
        except OSError as err:
            temporary = tempfile.gettempdir()
            raise CacheDiskFullError(
                _no_room_message(f"in {temporary}", describe_write_failure(temporary, err))
            ) from None
        _private = os.path.realpath(made)
        atexit.register(shutil.rmtree, _private, ignore_errors=True)
    return _private


def _check_room_of_private(folder: str) -> None:
    crowded = _too_full(folder) if folder == _private else None
    if crowded is not None:
        raise CacheDiskFullError(_no_room_message(folder, crowded))


def _no_room_message(where: str, problem: str) -> str:
    return (
        f"Inductor has no room to compile: its private temporary folder {where} cannot be "
        f"used ({problem}); free space there, or set TMPDIR, {INDUCTOR_CACHE_ENV} or "
        "SLOTWISE_CACHE_ROOT to a folder of yours on a disk with room"
    )


def _too_full(folder: str) -> str | None:
    """Why ``folder``'s disk has too little room for Inductor to compile, or None."""
    room = disk_room(folder)
    if room is None:  # cannot tell: let the compile try
        return None
    free_mib, free_inodes = room
    if free_mib < MIN_FREE_MIB:
        return f"its disk has {free_mib} MiB free, less than the {MIN_FREE_MIB} MiB Inductor needs"
    if free_inodes is not None and free_inodes < MIN_FREE_INODES:
        return (
            f"its disk has {free_inodes} inodes (files) free, fewer than the "
            f"{MIN_FREE_INODES} Inductor needs"
        )
    return None


def _room(folder: str) -> str:
    room = disk_room(folder)
    if room is None:
        return "free space unknown"
    return f"{room[0]} MiB free" if room[0] else "less than 1 MiB free"


def _switch_off_precompiled_headers() -> None:
    from torch._inductor import config as inductor_config

    inductor_config.cpp_cache_precompile_headers = False
    inductor_config.aot_inductor.precompile_headers = False


def _inductors_default() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # Dynamo has it

    return default_cache_dir()


def _under_temporary_folder(path: str) -> bool:
    temporary = os.path.realpath(tempfile.gettempdir())
    return os.path.commonpath([os.path.realpath(path), temporary]) == temporary


def _machine_key() -> str:
    return folder_key(inductor_folder_factors())
