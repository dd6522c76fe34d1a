"""A checkpoint's config.json, read the way Hugging Face transformers reads it.

Field names and defaults are transformers' (``rms_norm_eps`` 1e-6, ``head_dim``
hidden_size / num_attention_heads, ...).  RoPE comes in two forms: transformers 5
writes ``rope_parameters`` (with ``rope_theta`` inside), older checkpoints have a
top-level ``rope_theta`` and ``rope_scaling``; both are read.  Every error names
config.json, the field and the fix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from slotwise.layers.rotary_embedding import RopeScaling
from slotwise.models.errors import CheckpointError

logger = logging.getLogger("slotwise")

_REQUIRED = object()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFConfig:
    """The fields of one config.json, with typed reads."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data = data
        self.path = path

    @classmethod
    def read(cls, folder: Path) -> HFConfig:
        path = folder / "config.json"
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: no such folder; pass a checkpoint folder")
        if not path.is_file():
            raise CheckpointError(
                f"{path}: missing; a Hugging Face checkpoint folder holds config.json next to "
                "its *.safetensors files (transformers' save_pretrained writes both)"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not readable JSON ({exc}); save it again") from exc
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: holds {type(data).__name__}, not a JSON object")
        return cls(data, path)

    def error(self, message: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {message}")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        return self._typed(key, int, default)

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        return float(self._typed(key, (int, float), default))

    def flag(self, key: str, default: bool) -> bool:
        return self._typed(key, bool, default)

    def _typed(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = self.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self.error(f"field {key!r} is missing; the architecture needs it")
            return default
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(f"field {key!r} is {value!r}, not of the expected type")
        return value

    def architectures(self) -> list[str]:
        names = self.get("architectures", [])
        if not isinstance(names, list) or not names:
            raise self.error(
                "field 'architectures' is missing or empty; it names the model class, "
                'e.g. "architectures": ["LlamaForCausalLM"]'
            )
        return names

    def dtype(self) -> torch.dtype | None:
        """The dtype the checkpoint was saved in (``dtype``, formerly ``torch_dtype``)."""
        name = self.get("dtype", self.get("torch_dtype"))
        if name is None:
            return None
        if name not in DTYPES:
            raise self.error(f"dtype {name!r} is not supported; slotwise loads {', '.join(DTYPES)}")
        return DTYPES[name]

    def token_ids(self, key: str) -> tuple[int, ...]:
        """``bos_token_id`` / ``eos_token_id``: one id, a list of ids, or none."""
        value = self.get(key)
        ids = [] if value is None else value if isinstance(value, list) else [value]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise self.error(f"field {key!r} is {value!r}; expected a token id or a list of them")
        return tuple(ids)

    def rope(self, max_position: int) -> tuple[float, RopeScaling | None]:
        """``(rope_theta, scaling)`` from either config form; None scaling for "default"."""
        params = dict(self.get("rope_parameters") or self.get("rope_scaling") or {})
        if any(isinstance(value, dict) for value in params.values()):
            raise self.error(
                "rope_parameters differ per layer type; slotwise supports one RoPE for all layers"
            )
        theta = float(params.get("rope_theta", self.get("rope_theta", 10000.0)))
        partial = params.get("partial_rotary_factor", self.get("partial_rotary_factor", 1.0))
        if partial != 1.0:
            raise self.error(
                f"partial_rotary_factor is {partial}; slotwise rotates whole heads only"
            )
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "default":
            return theta, None
        try:
            if rope_type == "linear":
                return theta, RopeScaling("linear", float(params["factor"]))
            if rope_type == "llama3":
                return theta, RopeScaling(
                    "llama3",
                    float(params["factor"]),
                    float(params["low_freq_factor"]),
                    float(params["high_freq_factor"]),
                    int(params.get("original_max_position_embeddings", max_position)),
                )
        except KeyError as exc:
            raise self.error(f"rope type {rope_type!r} needs the field {exc.args[0]!r}") from None
        raise self.error(
            f"rope type {rope_type!r} is not supported; slotwise implements "
            "'default', 'linear' and 'llama3' (a checkpoint using another would give wrong "
            "logits, so it is refused)"
        )

    def max_position(self, num_layers: int) -> int:
        """``max_position_embeddings``, cut to the sliding window where layers use one.

        Attention over a window of W tokens equals full attention for sequences of at
        most W tokens, so capping the length keeps every accepted request exact.
        """
        max_position = self.integer("max_position_embeddings")
        window = self._sliding_window(num_layers)
        if window is not None and window < max_position:
            logger.warning(
                "%s: layers attend to a sliding window of %d tokens, which slotwise does not "
                "implement; requests are limited to %d tokens (not %d), where the window "
                "changes nothing",
                self.path,
                window,
                window,
                max_position,
            )
            return window
        return max_position

    def _sliding_window(self, num_layers: int) -> int | None:
        window = self.get("sliding_window")
        if window is None:
            return None
        layer_types = self.get("layer_types")
        if layer_types is not None:  # transformers 5 spells out each layer's kind
            return window if "sliding_attention" in layer_types else None
        if "use_sliding_window" in self.data:  # Qwen2/Qwen3: layers from max_window_layers
            use = self.get("use_sliding_window") and self.get("max_window_layers", 0) < num_layers
            return window if use else None
        return window  # Mistral: every layer
