"""Inductor's CPU vector-ISA probe, answered from disk after its first run on a machine.

Inductor starts one subprocess per candidate ISA (0.3-1 s each); the answer depends only
on the probe library, the interpreter, torch's libraries and the CPU, so it is stored
keyed by all four, under the cache root's trust rule.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import torch

from slotwise.cache_permissions import (
    make_private_directories,
    read_trusted_file,
    resolve_trusted_directory,
    untrusted_directory,
    write_atomically,
)
from slotwise.compilation.cache.hardware_identity import cpu_identity

logger = logging.getLogger(__name__)

_installed_root: str | None = None


def install_isa_probe_cache(cache_root: str) -> None:
    """Answer Inductor's ISA probes from ``cache_root/isa_probe`` (once per process); does
    nothing on another torch's probe or an untrusted folder."""
    global _installed_root
    if _installed_root is not None:
        return
    from torch._inductor import cpu_vec_isa

    probe = getattr(cpu_vec_isa.VecISA, "_probe_load", None)
    if probe is None:
        logger.debug(
            "torch %s has no VecISA._probe_load; ISA probes are not cached", torch.__version__
        )
        return
    _installed_root = cache_root
    root = os.path.abspath(os.path.expanduser(cache_root))
    folder, reason = resolve_trusted_directory(os.path.join(root, "isa_probe"), root)
    if reason is not None:
        logger.info(
            "ISA probe answers are not cached: %s; Inductor probes the CPU's vector ISAs "
            "in every process (a second or so)",
            reason,
        )
        return
    cpu_vec_isa.VecISA._probe_load = _cached_probe(probe, folder, os.path.dirname(folder))


def _cached_probe(
    probe: Callable[[Any, str], bool], folder: str, root: str
) -> Callable[[Any, str], bool]:
    @functools.wraps(probe)
    def probe_load(self: Any, output_path: str) -> bool:
        try:
            key = _probe_key(str(self), output_path)
        except OSError:
            return probe(self, output_path)
        path = os.path.join(folder, f"{key}.json")
        known = _read_answer(path, folder, root)
        if known is not None:
            return known
        answer = probe(self, output_path)
        _write_answer(path, folder, root, answer)
        return answer

    return probe_load


def _probe_key(isa: str, library: str) -> str:
    """Everything the probe's answer depends on, hashed."""
    with open(library, "rb") as file:
        library_hash = hashlib.sha256(file.read()).hexdigest()
    factors = {
        "isa": isa,
        "library": library_hash,
        "python": sys.executable,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_lib": os.path.join(os.path.dirname(torch.__file__), "lib"),
        "machine": platform.machine(),
        "cpu": cpu_identity(),
    }
    canonical = json.dumps(factors, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def _read_answer(path: str, folder: str, root: str) -> bool | None:
    if not os.path.isfile(path) or untrusted_directory(folder, root):
        return None
    try:
        answer = json.loads(read_trusted_file(path))["ok"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("ISA probe cache entry %s is unreadable (%s); probing again", path, err)
        return None
    return answer if isinstance(answer, bool) else None


def _write_answer(path: str, folder: str, root: str, answer: bool) -> None:
    """Write the answer only into a trusted tree: checked before creating anything (an
    untrusted root gets no new folder) and again after (one created meanwhile)."""
    try:
        if untrusted_directory(folder, root) is None:
            make_private_directories(folder)
            if untrusted_directory(folder, root) is None:
                write_atomically(path, json.dumps({"ok": answer}).encode("utf-8"))
    except OSError as err:
        logger.debug("ISA probe answer not cached at %s: %s", path, err)
