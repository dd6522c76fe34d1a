"""Inductor's caches kept where slotwise trusts them: beside slotwise's own, or private.

A slotwise cache entry for an Inductor piece holds the piece's generated code, not the
C++ or Triton kernels that code builds: a new process finds those in Inductor's cache
folder or compiles them again (a minute for the ``small`` preset on two cores, longer
than the cold start). Inductor's default folder is under the system's temporary folder,
which a reboot or a temp cleaner empties while slotwise's cache, under the home folder,
stays; every "warm" start after that would be a slow one. So, as vLLM does with its own
cache, slotwise points Inductor at ``<cache root>/inductor`` (private like the rest of its
cache) before Inductor first runs in the process, unless ``TORCHINDUCTOR_CACHE_DIR`` is
set: a folder the user chose is kept.

Inductor's folder holds code it runs: it imports the generated ``.py`` files it finds
there and loads their libraries, without asking who wrote them. The default folder's
name (``torchinductor_<user>``) is known in advance, so another local user can create it
first and plant code in it. Inductor is therefore never left on a folder slotwise does
not trust: when neither the cache root nor the chosen folder passes the checks of
:mod:`slotwise.cache_permissions`, its caches go to a fresh private folder of this
process, removed at exit (nothing compiled is kept for the next process).

Inductor's own cache keys its generated code on the graph and its settings, not on the
CPU's vector ISA, which was harmless in a folder no other machine sees. A cache root
under the home folder may be shared by machines (a network home), so each kind of
machine gets its own folder, named by a hash of the CPU, ``ATEN_CPU_CAPABILITY`` and
the GPUs (:mod:`slotwise.compilation.cache.hardware_identity`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile

from slotwise.cache_permissions import make_private_directories, untrusted_directory
from slotwise.compilation.cache.hardware_identity import cpu_identity, gpu_identity

logger = logging.getLogger("slotwise")

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
INDUCTOR_FOLDER = "inductor"
#: What a process using the private folder loses, said in its warning.
UNCACHED = (
    "Inductor's generated code, FX graphs, C++/Triton kernels and autotuning results are "
    "cached in a private temporary folder of this process only, removed at exit: nothing "
    "compiled now is kept for the next process"
)

#: This process's private folder for Inductor, once made.
_private: str | None = None


def place_inductor_cache(cache_root: str | None) -> str:
    """Point Inductor's caches at a folder slotwise trusts; the folder they will use.

    That is ``TORCHINDUCTOR_CACHE_DIR`` when set and trusted, else
    ``cache_root/inductor/<machine>`` when it is trusted, else (and when ``cache_root``
    is None: the compile cache is off) a private temporary folder of this process.

    Inductor reads the variable each time it needs its folder, and sets it to its default
    the first time (importing Dynamo does): so this runs before Dynamo is imported, and a
    process that imported Dynamo before keeps Inductor's default folder if it is trusted.
    """
    chosen = os.environ.get(INDUCTOR_CACHE_ENV)
    if chosen and chosen == _private:
        return chosen  # placed here earlier in this process
    if chosen:
        reason = untrusted_directory(chosen, chosen)
        if reason is None:
            _keep_chosen(chosen)
            _check_triton_cache(chosen)
            return chosen
        return _use_private_folder(f"{INDUCTOR_CACHE_ENV}={chosen} is not used: {reason}")
    if cache_root is None:
        return _use_private_folder("the compile cache is off", warn=False)
    root = os.path.abspath(os.path.expanduser(cache_root))
    folder = os.path.join(root, INDUCTOR_FOLDER, _machine_key())
    reason = untrusted_directory(folder, root)
    if reason is None:
        try:
            make_private_directories(folder)
        except OSError as err:
            reason = f"{folder} cannot be created ({err})"
        else:
            reason = untrusted_directory(folder, root)  # created meanwhile by another user
    if reason is not None:
        return _use_private_folder(f"the compile cache root is not trusted: {reason}")
    os.environ[INDUCTOR_CACHE_ENV] = folder
    _check_triton_cache(folder)
    logger.info(
        "Inductor's cache is %s, beside slotwise's (set %s to choose another)",
        folder,
        INDUCTOR_CACHE_ENV,
    )
    return folder


def place_precompiled_headers() -> None:
    """Keep Inductor's precompiled C++ headers in its cache folder too.

    Inductor writes them under its *default* folder whatever ``TORCHINDUCTOR_CACHE_DIR``
    says, and compiles every CPU kernel with the ``.gch`` it finds there: a header planted
    in that shared folder would be built into every kernel. Where this torch keeps them
    elsewhere than this knows, precompiling is switched off for the process instead.
    Imports Inductor: called where Inductor is about to compile anyway.
    """
    from torch._inductor import codecache
    from torch._inductor import config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        headers = os.path.join(cache_dir(), "precompiled_headers")
        codecache._HEADER_DIR = headers
        codecache._HEADER_LOCK_DIR = os.path.join(headers, "locks")
        return
    logger.debug("no Inductor header folder known in this torch; headers are not precompiled")
    inductor_config.cpp_cache_precompile_headers = False
    inductor_config.aot_inductor.precompile_headers = False


def _keep_chosen(chosen: str) -> None:
    if "torch._dynamo" in sys.modules and _under_temporary_folder(chosen):
        logger.info(
            "Inductor's cache stays in %s, under the system's temporary folder: Dynamo "
            "was imported before slotwise compiled, which fixed it. Its compiled kernels "
            "will not outlive a reboot; set %s to keep them",
            chosen,
            INDUCTOR_CACHE_ENV,
        )
    else:
        logger.debug("Inductor's cache stays in %s (%s is set)", chosen, INDUCTOR_CACHE_ENV)


def _check_triton_cache(inductor_folder: str) -> None:
    """A ``TRITON_CACHE_DIR`` slotwise does not trust is replaced by one inside
    Inductor's folder (where Inductor puts Triton's cache when the variable is unset)."""
    chosen = os.environ.get(TRITON_CACHE_ENV)
    reason = untrusted_directory(chosen, chosen) if chosen else None
    if reason is None:
        return
    folder = os.path.join(inductor_folder, "triton")
    logger.warning(
        "%s=%s is not used: %s; Triton's kernels are cached in %s instead",
        TRITON_CACHE_ENV,
        chosen,
        reason,
        folder,
    )
    os.environ[TRITON_CACHE_ENV] = folder


def _use_private_folder(why: str, *, warn: bool = True) -> str:
    folder = _private_folder()
    os.environ[INDUCTOR_CACHE_ENV] = folder
    _check_triton_cache(folder)
    if warn:
        logger.warning(
            "%s; %s (%s). Fix the folder, or set %s or SLOTWISE_CACHE_ROOT to a folder of yours",
            why,
            UNCACHED,
            folder,
            INDUCTOR_CACHE_ENV,
        )
    else:
        logger.info("%s; %s (%s)", why, UNCACHED, folder)
    return folder


def _private_folder() -> str:
    """A new folder only this user can enter (0700), made once per process and removed
    at exit: nobody else can have planted anything in it."""
    global _private
    if _private is None:
        _private = tempfile.mkdtemp(prefix="slotwise-inductor-")
        atexit.register(shutil.rmtree, _private, ignore_errors=True)
    return _private


def _under_temporary_folder(path: str) -> bool:
    temporary = os.path.abspath(tempfile.gettempdir())
    return os.path.commonpath([os.path.abspath(path), temporary]) == temporary


def _machine_key() -> str:
    described = json.dumps(
        [cpu_identity(), os.environ.get("ATEN_CPU_CAPABILITY", ""), gpu_identity()]
    )
    return hashlib.sha256(described.encode("utf-8")).hexdigest()[:16]
