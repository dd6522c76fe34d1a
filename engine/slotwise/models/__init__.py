"""Models built from slotwise layers, and the loader of Hugging Face checkpoints.

``load_model(path)`` reads a checkpoint folder (config.json and safetensors files);
``supported_architectures()`` lists what it can build.  Both are imported on first
use, so importing this package does not import torch or safetensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotwise.models.errors import CheckpointError

if TYPE_CHECKING:
    from slotwise.models.loader import load_model
    from slotwise.models.registry import supported_architectures

__all__ = ["CheckpointError", "load_model", "supported_architectures"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from slotwise.models.loader import load_model

        return load_model
    if name == "supported_architectures":
        from slotwise.models.registry import supported_architectures

        return supported_architectures
    raise AttributeError(f"module 'slotwise.models' has no attribute {name!r}")
