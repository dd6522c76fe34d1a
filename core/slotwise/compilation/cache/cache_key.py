"""What compiled code is keyed on: the compile cache's folder, its per-piece entries and
Inductor's folder, each hashed from named factor groups.

Every factor belongs to exactly one group, and each key names the groups it hashes, so
changing what keys the cache is one edit here.  The groups:

- ``versions``: slotwise's, torch's (release and git commit) and Python's;
- ``config``: the compilation settings that change compiled code (``compute_hash``);
- ``traced_code``: the model's class, the hash of its source and the graph's index;
- ``compiler``: the compiler's class and its own settings (``Compiler.compute_hash``);
- ``device``: the platform, its device's identity (``Platform.device_identity``) and the
  host CPU (architecture, model and flags, ``ATEN_CPU_CAPABILITY``);
- per piece, ``runtime_shape`` and ``traced_piece`` (the piece's structural fingerprint),
  inside the folder the groups above name.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from slotwise.compilation.cache.hardware_identity import cpu_identity, device_identity
from slotwise.platforms import Platform, get_current_platform
from slotwise.version import __version__

if TYPE_CHECKING:
    import torch.fx as fx

    from slotwise.compilation.compilers import Compiler
    from slotwise.compilation.config import CompilationConfig

#: A group's factors by name; JSON-serialisable, written beside the cache's entries.
FactorGroup = dict[str, Any]
#: Length of the folder keys in hex digits (the per-piece key is a full SHA-256).
FOLDER_KEY_LENGTH = 16


def versions() -> FactorGroup:
    """The software that compiled the code; each version appears here and nowhere else."""
    return {
        "slotwise": __version__,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def config_group(config: CompilationConfig) -> FactorGroup:
    """The compilation settings that change compiled code (runtime-only knobs stay out)."""
    return {"hash": config.compute_hash()}


def traced_code(module: torch.nn.Module) -> FactorGroup:
    """The model whose forward is traced: its class, and the source of every model class
    in it, so an edited model never loads code compiled from the old one."""
    cls = type(module)
    return {"model": f"{cls.__module__}.{cls.__qualname__}", "model_source": _source_hash(module)}


def compiler_group(compiler: Compiler) -> FactorGroup:
    """The compiler and its own settings that change its output."""
    cls = type(compiler)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "settings": compiler.compute_hash()}


def device(device_platform: Platform | None = None) -> FactorGroup:
    """What compiled code is specialised to on this machine: the platform and its device's
    identity as the platform tells it, and the host CPU with the vector ISA ATen may be
    told to use (code for one runs wrong numbers silently on another)."""
    owner = device_platform or get_current_platform()
    return {
        "platform": owner.name,
        "identity": device_identity(owner),
        "machine": platform.machine(),
        "cpu": cpu_identity(),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
    }


def directory_factors(
    config: CompilationConfig, compiler: Compiler, code: Mapping[str, str]
) -> dict[str, FactorGroup]:
    """The groups the compile cache's folder is keyed on; ``code`` is the traced code."""
    return {
        "versions": versions(),
        "config": config_group(config),
        "traced_code": dict(code),
        "compiler": compiler_group(compiler),
        "device": device(),
    }


def inductor_folder_factors() -> dict[str, FactorGroup]:
    """The groups Inductor's folder is keyed on: Inductor keys its entries on versions and
    settings itself, but not its C++ code on the CPU nor its kernels on the device."""
    return {"device": device()}


def folder_key(groups: Mapping[str, FactorGroup]) -> str:
    """The name of a folder keyed on ``groups``."""
    return _digest(groups)[:FOLDER_KEY_LENGTH]


def piece_key(
    graph: fx.GraphModule, example_inputs: Sequence[Any], runtime_shape: int | None
) -> str:
    """The key of one compiled piece inside its folder: equal for structurally identical
    pieces compiled for the same inputs and size.  Raises ``UnfingerprintableGraph``."""
    # Imported here: the fingerprint needs sympy, which an eager start never loads.
    from slotwise.compilation.cache.graph_fingerprint import fingerprint

    groups = {
        "runtime_shape": repr(runtime_shape),
        "traced_piece": fingerprint(graph, example_inputs, runtime_shape),
    }
    return _digest(groups)


def _digest(groups: Mapping[str, Any]) -> str:
    canonical = json.dumps(groups, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _source_hash(module: torch.nn.Module) -> str:
    """Hash of the source of every model class in ``module`` (torch's own excluded)."""
    digest = hashlib.sha256()
    seen: set[type] = set()
    for submodule in module.modules():
        for cls in type(submodule).__mro__:
            if cls in seen or cls.__module__.split(".")[0] in ("torch", "builtins"):
                continue
            seen.add(cls)
            try:
                source = inspect.getsource(cls)
            except (OSError, TypeError):
                source = cls.__qualname__  # defined interactively: no source to hash
            digest.update(f"{cls.__module__}.{cls.__qualname__}\n{source}".encode())
    return digest.hexdigest()
