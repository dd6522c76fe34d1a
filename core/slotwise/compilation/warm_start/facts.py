"""Unguarded facts: what Dynamo folds into a trace without a guard.

Dynamo takes a few facts as fixed for the life of a process and bakes them into graphs as
constants, guarding none of them: the distributed rank and world size, which accelerators
exist and their properties, inference mode, and its own configuration. Another process may
differ in any of them, so the cold process saves them with the trace and a warm process
compares them with its own (:func:`unguarded_facts`). The device is described by its
platform (``Platform.device_identity``), never probed here. :func:`plain_repr`, the stable text
Dynamo's configuration is hashed with, also describes the model in the store's entry names.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any

import torch

from slotwise.compilation.cache.hardware_identity import device_identity

_PLAIN = (type(None), bool, int, float, complex, str)


def unguarded_facts() -> dict[str, Any]:
    """What Dynamo folds into a graph as a constant without a guard (it assumes the
    process never changes them): distributed rank and world size, the accelerator and
    the platform's device, inference mode; and Dynamo's own configuration."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    accelerator = torch.accelerator.current_accelerator()
    return {
        "distributed": [dist.get_rank(), dist.get_world_size()] if distributed else None,
        "accelerator": None if accelerator is None else accelerator.type,
        "device": device_identity(),
        "privateuse1_backend": torch._C._get_privateuse1_backend_name(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "dynamo_config": _dynamo_config_hash(),
    }


def _dynamo_config_hash() -> str:
    """Dynamo's settings that change traces (those its own config hash covers), hashed
    with a stable text: sets sorted, objects by type."""
    config = torch._dynamo.config
    settings = config._get_dict(ignored_keys=list(config._compile_ignored_keys))
    text = "\n".join(f"{key}={plain_repr(value)}" for key, value in sorted(settings.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def plain_repr(value: Any, depth: int = 0) -> str:
    """A stable text for plain values (sets sorted); other objects by type only."""
    if isinstance(value, _PLAIN) or isinstance(value, (torch.dtype, torch.device)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if depth < 4 and isinstance(value, (tuple, list, frozenset, set)):
        items = (
            sorted(plain_repr(v, depth + 1) for v in value)
            if isinstance(value, (set, frozenset))
            else [plain_repr(v, depth + 1) for v in value]
        )
        return f"{type(value).__name__}({','.join(items)})"
    if depth < 4 and isinstance(value, dict):
        return (
            "dict("
            + ",".join(
                f"{k!r}:{plain_repr(v, depth + 1)}"
                for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))
            )
            + ")"
        )
    if depth < 4 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ",".join(
            f"{f.name}={plain_repr(getattr(value, f.name), depth + 1)}"
            for f in dataclasses.fields(value)
        )
        return f"{type(value).__qualname__}({fields})"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"
