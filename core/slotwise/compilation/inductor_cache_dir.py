"""Inductor's own cache kept inside slotwise's, so a warm start finds its compiled kernels.

A slotwise cache entry for an Inductor piece holds the piece's generated code, not the
C++ or Triton kernels that code builds: a new process finds those in Inductor's cache
folder or compiles them again (a minute for the ``small`` preset on two cores, longer
than the cold start). Inductor's default folder is under the system's temporary folder,
which a reboot or a temp cleaner empties while slotwise's cache, under the home folder,
stays; every "warm" start after that would be a slow one. So, as vLLM does with its own
cache, slotwise points Inductor at ``<cache root>/inductor`` (private like the rest of its
cache) before Inductor first runs in the process, unless ``TORCHINDUCTOR_CACHE_DIR`` is
set: a folder the user chose is kept.

Inductor's own cache keys its generated code on the graph and its settings, not on the
CPU's vector ISA, which was harmless in a folder no other machine sees. A cache root
under the home folder may be shared by machines (a network home), so each kind of
machine gets its own folder, named by a hash of the CPU, ``ATEN_CPU_CAPABILITY`` and
the GPUs (:mod:`slotwise.compilation.hardware_identity`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile

from slotwise.cache_permissions import make_private_directories, untrusted_directory
from slotwise.compilation.hardware_identity import cpu_identity, gpu_identity

logger = logging.getLogger("slotwise")

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
INDUCTOR_FOLDER = "inductor"


def place_inductor_cache(cache_root: str) -> str | None:
    """Point Inductor's cache at ``cache_root/inductor/<machine>`` unless
    ``TORCHINDUCTOR_CACHE_DIR`` is set; the folder Inductor will use, None when it keeps
    its default.

    Inductor reads the variable each time it needs its folder, and sets it to its default
    the first time (importing Dynamo does): so this must run before Dynamo is imported,
    and in a process that imported Dynamo before, Inductor's folder stays as it was.
    """
    chosen = os.environ.get(INDUCTOR_CACHE_ENV)
    if chosen:
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
        return chosen
    root = os.path.abspath(os.path.expanduser(cache_root))
    folder = os.path.join(root, INDUCTOR_FOLDER, _machine_key())
    reason = untrusted_directory(folder, root)
    if reason is None:
        try:
            make_private_directories(folder)
        except OSError as err:
            reason = f"{folder} cannot be created ({err})"
    if reason is not None:
        logger.warning(
            "Inductor's cache is left in its default folder under the system's temporary "
            "folder (%s): compiled kernels will not outlive a reboot. Fix the folder or set "
            "%s to a folder of yours",
            reason,
            INDUCTOR_CACHE_ENV,
        )
        return None
    os.environ[INDUCTOR_CACHE_ENV] = folder
    logger.info(
        "Inductor's cache is %s, beside slotwise's (set %s to choose another)",
        folder,
        INDUCTOR_CACHE_ENV,
    )
    return folder


def _under_temporary_folder(path: str) -> bool:
    temporary = os.path.abspath(tempfile.gettempdir())
    return os.path.commonpath([os.path.abspath(path), temporary]) == temporary


def _machine_key() -> str:
    described = json.dumps(
        [cpu_identity(), os.environ.get("ATEN_CPU_CAPABILITY", ""), gpu_identity()]
    )
    return hashlib.sha256(described.encode("utf-8")).hexdigest()[:16]
