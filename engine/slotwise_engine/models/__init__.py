"""Models built from slotwise layers, and the loader of Hugging Face checkpoints.

``load_model(path)`` reads a checkpoint folder (config.json and safetensors files);
``supported_architectures()`` lists what it can build.  Both are imported on first
use, so importing this package does not import torch or safetensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slotwise.lazy_exports import lazy_exports
from slotwise_engine.models.errors import CheckpointError

if TYPE_CHECKING:
    from slotwise_engine.models.loader import load_model
    from slotwise_engine.models.registry import supported_architectures

__all__ = ["CheckpointError", "load_model", "supported_architectures"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "load_model": "slotwise_engine.models.loader",
        "supported_architectures": "slotwise_engine.models.registry",
    },
)
