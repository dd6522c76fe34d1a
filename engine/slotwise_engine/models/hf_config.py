"""A checkpoint's config.json, read the way Hugging Face transformers reads it, and
checked in one place before anything is built.

Field names and defaults are transformers' (``rms_norm_eps`` 1e-6, ``head_dim``
hidden_size / num_attention_heads, ...); where a family's config class reads a key
its own way (Qwen3's ``head_dim`` 128, Mistral's sliding window), ``FamilyRules``
says so.  RoPE comes in two forms: transformers 5 writes ``rope_parameters`` (with
``rope_theta`` inside), older checkpoints have a top-level ``rope_theta`` and
``rope_scaling``; both are read, and where keys overlap the one transformers 5 uses
wins (``rope_scaling`` over ``rope_parameters``, a top-level
``original_max_position_embeddings`` over the one inside).  ``llama_config`` is the
one validation of a Llama-family config: every field's type and range and the
relations between fields.  Each failure is one ``CheckpointError`` naming
config.json, the field, its value and what is allowed.
"""

from __future__ import annotations

import logging
import math
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from slotwise.layers.rotary_embedding import RopeScaling, yarn_attention_factor
from slotwise_engine.models.errors import CheckpointError
from slotwise_engine.models.llama_config import LlamaConfig
from slotwise_engine.models.model_files import parse_model_json, read_model_file

logger = logging.getLogger(__name__)

_REQUIRED = object()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: config.json is a few kilobytes; anything far larger is not a model config.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Real configs nest three levels (rope_parameters per layer type); a JSON parser
#: recursing much deeper runs out of stack.
MAX_NESTING = 16
#: The longest context accepted (2^24 tokens, above any released model's).
MAX_CONTEXT = 1 << 24
#: Upper bounds that no real model reaches, so a typo or a corrupted file is refused
#: before its sizes reach an allocator.
INTEGER_LIMITS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 4096,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 4096,
    "max_position_embeddings": MAX_CONTEXT,
}
#: The largest finite float32: a RoPE base or factor beyond it overflows the table.
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)

_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxstring, _shown.maxother, _shown.maxlist, _shown.maxdict = 2, 60, 60, 4, 4


def read_config_text(path: Path) -> bytes:
    """config.json's bytes, at most ``MAX_CONFIG_BYTES``: a regular file of the model
    folder (or a blob of its Hugging Face cache), never a device, a FIFO or a file
    elsewhere."""
    return read_model_file(path.parent, path.name, limit=MAX_CONFIG_BYTES)


#: transformers' window where a sliding-window family's config.json has no
#: ``sliding_window`` key (null means no window).
DEFAULT_SLIDING_WINDOW = 4096


@dataclass(frozen=True)
class FamilyRules:
    """How one family's transformers config class reads the keys it reads its own way."""

    #: ``num_key_value_heads`` where the key is absent (None: num_attention_heads).
    num_kv_heads: int | None = None
    #: ``head_dim`` where the key is absent (None: hidden_size / num_attention_heads).
    head_dim: int | None = None
    #: Which layers attend to a ``sliding_window`` (null: none):
    #: ``"layer_types"``: those ``layer_types`` marks ``sliding_attention``, all where
    #: it is absent; no window where ``sliding_window`` is absent.  Llama's model has
    #: no window, but transformers' KV cache keeps only the last ``sliding_window``
    #: tokens of those layers, so its decoding past the window attends to one.
    #: ``"every_layer"`` (Mistral): all, 4096 where ``sliding_window`` is absent;
    #: where ``layer_types`` is present, transformers reads the config as Ministral's,
    #: whose layers slide as ``layer_types`` says.
    #: ``"per_layer"`` (Qwen2/Qwen3): none unless ``use_sliding_window``; then those
    #: ``layer_types`` marks, else those from ``max_window_layers`` on (4096 where
    #: ``sliding_window`` is absent).
    sliding_window: Literal["layer_types", "every_layer", "per_layer"] = "layer_types"
    #: ``max_window_layers`` where the key is absent (``"per_layer"`` only).
    max_window_layers: int = 28


class HFConfig:
    """The fields of one config.json, with typed and range-checked reads."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data = data
        self.path = path

    @classmethod
    def read(cls, folder: Path) -> HFConfig:
        path = folder / "config.json"
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: no such folder; pass a checkpoint folder")
        if not os.path.lexists(path):
            raise CheckpointError(
                f"{path}: missing; a Hugging Face checkpoint folder holds config.json next to "
                "its *.safetensors files (transformers' save_pretrained writes both)"
            )
        try:
            raw = read_config_text(path)
        except OSError as exc:
            raise CheckpointError(f"{path}: not readable ({exc}); check its permissions") from exc
        depth = _nesting(raw)
        if depth > MAX_NESTING:
            raise CheckpointError(
                f"{path}: nests {depth} levels deep; a model config nests at most "
                f"{MAX_NESTING}; save config.json again"
            )
        data = parse_model_json(path, raw)
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: holds {type(data).__name__}, not a JSON object")
        return cls(data, path)

    def error(self, message: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {message}")

    def invalid(self, key: str, value: Any, allowed: str) -> CheckpointError:
        """The error of field ``key`` holding ``value``, which is not ``allowed``."""
        return self.error(f"field {key!r} is {_shown.repr(value)}; expected {allowed}")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def integer(
        self, key: str, default: Any = _REQUIRED, *, low: int = 1, high: int | None = None
    ) -> int:
        """Field ``key``, an integer from ``low`` to ``high`` (default: INTEGER_LIMITS)."""
        value = self._present(key, default)
        high = INTEGER_LIMITS.get(key, MAX_CONTEXT) if high is None else high
        return _integer(self, key, value, low, high)

    def number(
        self, key: str, default: Any = _REQUIRED, *, above: float, high: float = _FLOAT32_MAX
    ) -> float:
        """Field ``key``, a finite number greater than ``above`` and at most ``high``."""
        return _number(self, key, self._present(key, default), above, high)

    def flag(self, key: str, default: bool) -> bool:
        value = self._present(key, default)
        if not isinstance(value, bool):
            raise self.invalid(key, value, "true or false")
        return value

    def _present(self, key: str, default: Any) -> Any:
        value = self.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self.error(f"field {key!r} is missing; the architecture needs it")
            return default
        return value

    def architectures(self) -> list[str]:
        names = self.get("architectures", [])
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise self.error(
                f"field 'architectures' is {_shown.repr(names)}; it names the model class, "
                'e.g. "architectures": ["LlamaForCausalLM"]'
            )
        return names

    def dtype(self) -> torch.dtype | None:
        """The dtype the checkpoint was saved in (``dtype``, formerly ``torch_dtype``)."""
        key = "dtype" if self.get("dtype") is not None else "torch_dtype"
        name = self.get(key)
        if name is None:
            return None
        if not isinstance(name, str) or name not in DTYPES:
            raise self.invalid(key, name, f"one of {', '.join(DTYPES)}")
        return DTYPES[name]

    def token_ids(self, key: str) -> tuple[int, ...]:
        """``bos_token_id`` / ``eos_token_id``: one id, a list of ids, or none."""
        value = self.get(key)
        ids = [] if value is None else value if isinstance(value, list) else [value]
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**63 for i in ids):
            raise self.invalid(
                key, value, "a token id (an integer from 0 to 2^63 - 1) or a list of them"
            )
        return tuple(ids)

    def rope(self, max_position: int) -> tuple[float, RopeScaling | None]:
        """``(rope_theta, scaling)`` as transformers 5 derives them from either config
        form; None scaling for "default".

        ``max_position`` is ``max_position_embeddings``, the default of
        ``original_max_position_embeddings`` as in transformers.
        """
        key, params = self._rope_object()
        if any(isinstance(value, dict) for value in params.values()):
            raise self.error(
                f"{key} differ per layer type; slotwise supports one RoPE for all layers"
            )
        rope = _RopeFields(self, key, params)
        if params.get("rope_theta") is not None:  # inside the object, it wins
            theta = rope.number("rope_theta", _REQUIRED, 1.0)
        else:
            theta = self.number("rope_theta", 10000.0, above=1.0)
        partial = params.get("partial_rotary_factor", self.get("partial_rotary_factor", 1.0))
        if partial != 1.0 or isinstance(partial, bool):
            raise self.error(
                f"partial_rotary_factor is {_shown.repr(partial)}; slotwise rotates whole "
                "heads only (1.0)"
            )
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "default":
            return theta, None
        if rope_type in ("linear", "dynamic"):
            factor = rope.number("factor", _REQUIRED, 1.0, inclusive=True)
            return theta, RopeScaling(rope_type, factor, original_max_position=max_position)
        if rope_type == "llama3":
            low = rope.number("low_freq_factor", _REQUIRED, 0.0)
            high = rope.number("high_freq_factor", _REQUIRED, low)
            return theta, RopeScaling(
                "llama3",
                rope.number("factor", _REQUIRED, 1.0, inclusive=True),
                low,
                high,
                self._original_context(rope, max_position),
            )
        if rope_type == "yarn":
            return theta, _yarn(rope, self._original_context(rope, max_position))
        raise self.error(
            f"rope type {_shown.repr(rope_type)} is not supported; slotwise implements "
            "'default', 'linear', 'llama3', 'dynamic' and 'yarn' (a checkpoint using another "
            "would give wrong logits, so it is refused)"
        )

    def _rope_object(self) -> tuple[str, dict[str, Any]]:
        """The key and value of the RoPE object transformers 5 uses: ``rope_scaling``
        where it is a non-empty object (it replaces ``rope_parameters`` whole,
        ``rope_theta`` included), else ``rope_parameters``."""
        objects = {}
        for key in ("rope_scaling", "rope_parameters"):
            value = self.get(key, {})
            if not isinstance(value, dict):
                raise self.invalid(key, value, "a JSON object (rope_type, rope_theta, factor, ...)")
            objects[key] = value
        scaling, parameters = objects["rope_scaling"], objects["rope_parameters"]
        if not scaling:
            return "rope_parameters", parameters
        if parameters and parameters != scaling:
            logger.warning(
                "%s: both rope_scaling and rope_parameters describe RoPE; as in transformers, "
                "rope_scaling is used and rope_parameters ignored (rope_theta comes from "
                "rope_scaling, else the top-level rope_theta, else 10000); keep one of the keys",
                self.path,
            )
        return "rope_scaling", scaling

    def _original_context(self, rope: _RopeFields, max_position: int) -> int:
        """``original_max_position_embeddings`` of llama3 and yarn RoPE: a top-level key
        overrides the one inside the RoPE object (transformers' ``standardize_rope_params``
        does so when the model is built), which defaults to ``max_position``."""
        key = "original_max_position_embeddings"
        if self.get(key) is None:
            return rope.integer(key, max_position)
        outside = self.integer(key, high=MAX_CONTEXT)
        inside = rope.params.get(key)
        if inside is not None and inside != outside:
            logger.warning(
                "%s: %s is %d at the top level and %s inside %s; as in transformers, the "
                "top-level value is used; keep one of the keys",
                self.path,
                key,
                outside,
                _shown.repr(inside),
                rope.key,
            )
        return outside

    def max_position(self, num_layers: int, rules: FamilyRules, context: int | None = None) -> int:
        """The context served: ``context`` (default ``max_position_embeddings``), cut to
        the sliding window where layers use one.

        Attention over a window of W tokens equals full attention for sequences of at
        most W tokens, so capping the length keeps every accepted request exact.
        """
        max_position = context or self.integer("max_position_embeddings")
        window = self.sliding_window(num_layers, rules)
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

    def sliding_window(self, num_layers: int, rules: FamilyRules) -> int | None:
        """The window some layer attends to in the family's transformers model; None
        where every layer attends to all tokens."""
        per_layer = rules.sliding_window == "per_layer"
        use = self.flag("use_sliding_window", False) if per_layer else True
        default = None if rules.sliding_window == "layer_types" else DEFAULT_SLIDING_WINDOW
        window = self._window(default) if use else None
        layer_types = self._layer_types(num_layers)
        if layer_types is None:
            if not per_layer or window is None:
                return window
            first = self.integer("max_window_layers", rules.max_window_layers, low=0, high=1 << 20)
            return window if first < num_layers else None  # the layers from first on slide
        if "sliding_attention" not in layer_types:
            return None
        if window is None:
            cause, fix = (
                ("use_sliding_window is not true", "set use_sliding_window to true")
                if not use
                else ("sliding_window is not set", "set sliding_window")
            )
            raise self.error(
                f"layer_types lists sliding_attention layers but {cause}, so transformers "
                f"has no window for them (and fails); {fix}, or list only full_attention layers"
            )
        return window

    def _window(self, default: int | None) -> int | None:
        """``sliding_window``: ``default`` where the key is absent, none where null."""
        if "sliding_window" not in self.data:
            return default
        if self.data["sliding_window"] is None:
            return None
        return self.integer("sliding_window", high=MAX_CONTEXT)

    def _layer_types(self, num_layers: int) -> list[str] | None:
        """transformers 5's ``layer_types``: each layer's kind, spelled out."""
        layer_types = self.get("layer_types")
        kinds = ("full_attention", "sliding_attention")
        if layer_types is not None and (
            not isinstance(layer_types, list)
            or len(layer_types) != num_layers
            or not all(isinstance(kind, str) and kind in kinds for kind in layer_types)
        ):
            raise self.invalid(
                "layer_types",
                layer_types,
                f"a list of num_hidden_layers ({num_layers}) entries, each "
                "'full_attention' or 'sliding_attention'",
            )
        return layer_types


class _RopeFields:
    """Typed reads of one RoPE object (``rope_parameters`` or ``rope_scaling``)."""

    def __init__(self, hf: HFConfig, key: str, params: dict[str, Any]) -> None:
        self.hf, self.key, self.params = hf, key, params

    def _present(self, field: str, default: Any) -> Any:
        value = self.params.get(field)
        if value is None:
            if default is _REQUIRED:
                rope_type = self.params.get("rope_type", self.params.get("type"))
                raise self.hf.error(
                    f"rope type {_shown.repr(rope_type)} needs the field {field!r} in {self.key}"
                )
            return default
        return value

    def number(self, field: str, default: Any, above: float, *, inclusive: bool = False) -> float:
        """A finite number > ``above`` (>= with ``inclusive``)."""
        value = self._present(field, default)
        return _number(self.hf, f"{self.key}.{field}", value, above, _FLOAT32_MAX, inclusive)

    def integer(self, field: str, default: Any) -> int:
        value = self._present(field, default)
        return _integer(self.hf, f"{self.key}.{field}", value, 1, MAX_CONTEXT)

    def flag(self, field: str, default: bool) -> bool:
        value = self._present(field, default)
        if not isinstance(value, bool):
            raise self.hf.invalid(f"{self.key}.{field}", value, "true or false")
        return value

    def optional(self, field: str) -> float | None:
        """A number that transformers treats as absent when 0 or null."""
        value = self.params.get(field)
        if value is None or (value == 0 and not isinstance(value, bool)):
            return None
        return self.number(field, None, 0.0)


def _yarn(rope: _RopeFields, original_max_position: int) -> RopeScaling:
    factor = rope.number("factor", _REQUIRED, 1.0, inclusive=True)
    beta_fast = rope.optional("beta_fast") or 32.0
    beta_slow = rope.optional("beta_slow") or 1.0
    if beta_fast <= beta_slow:
        raise rope.hf.error(
            f"{rope.key}: beta_fast ({beta_fast:g}) is not above beta_slow ({beta_slow:g}); "
            "YaRN blends the dimensions between them (defaults 32 and 1)"
        )
    attention = rope.params.get("attention_factor")
    attention_factor = (
        yarn_attention_factor(factor, rope.optional("mscale"), rope.optional("mscale_all_dim"))
        if attention is None
        else rope.number("attention_factor", None, 0.0)
    )
    return RopeScaling(
        "yarn",
        factor,
        original_max_position=original_max_position,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=rope.flag("truncate", True),
        attention_factor=attention_factor,
    )


def _integer(hf: HFConfig, key: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise hf.invalid(key, value, f"an integer from {low} to {high}")
    return value


def _number(
    hf: HFConfig, key: str, value: Any, above: float, high: float, inclusive: bool = False
) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    number = float(value) if ok and abs(value) <= _FLOAT32_MAX else math.nan
    low_ok = number >= above if inclusive else number > above
    if not (ok and math.isfinite(number) and low_ok and number <= high):
        relation = ">=" if inclusive else ">"
        raise hf.invalid(key, value, f"a finite number {relation} {above:g}, at most {high:.4g}")
    return number


def _nesting(raw: bytes) -> int:
    """How deep JSON text nests arrays and objects, counted without recursion
    (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def llama_config(hf: HFConfig, rules: FamilyRules = FamilyRules()) -> LlamaConfig:
    """The ``LlamaConfig`` of a Llama-family config.json, read by the family's
    ``rules``, every field and relation checked before anything is built."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise hf.invalid("hidden_act", act, "'silu', the only activation slotwise implements")
    if hf.get("quantization_config") is not None:
        raise hf.error("quantized checkpoints are not supported; use unquantized weights")
    vocab_size = hf.integer("vocab_size")
    hidden_size = hf.integer("hidden_size")
    num_heads = hf.integer("num_attention_heads")
    # transformers: the family's default where the key is absent, num_heads where null
    absent = "num_key_value_heads" not in hf.data and rules.num_kv_heads is not None
    num_kv_heads = hf.integer("num_key_value_heads", rules.num_kv_heads if absent else num_heads)
    if num_heads % num_kv_heads and absent:
        raise hf.error(
            f"field 'num_key_value_heads' is missing, and this family's default "
            f"({num_kv_heads}, as in transformers) does not divide num_attention_heads "
            f"({num_heads}); set num_key_value_heads"
        )
    if num_heads % num_kv_heads:
        raise hf.invalid(
            "num_key_value_heads",
            num_kv_heads,
            f"a divisor of num_attention_heads ({num_heads}): each KV head serves as many "
            "query heads",
        )
    head_dim = hf.integer("head_dim") if hf.get("head_dim") is not None else rules.head_dim
    if head_dim is None and hidden_size % num_heads:
        raise hf.error(
            f"hidden_size ({hidden_size}) is not a multiple of num_attention_heads "
            f"({num_heads}); set head_dim, or fix either field"
        )
    head_size = head_dim if head_dim is not None else hidden_size // num_heads
    if head_size % 2:
        key = "head_dim" if head_dim is not None else "hidden_size / num_attention_heads"
        raise hf.invalid(key, head_size, "an even head size: RoPE rotates pairs of elements")
    num_layers = hf.integer("num_hidden_layers")
    declared = hf.integer("max_position_embeddings")
    rope_theta, rope_scaling = hf.rope(declared)
    if rope_scaling is not None and rope_scaling.length_dependent and head_size <= 2:
        raise hf.invalid("head_dim", head_size, "at least 4 for 'dynamic' RoPE scaling")
    context = _context(declared, rope_scaling)
    max_position = hf.max_position(num_layers, rules, context)
    attention_bias = hf.flag("attention_bias", False)
    bos = hf.token_ids("bos_token_id")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hf.integer("intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position=max_position,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rms_norm_eps=hf.number("rms_norm_eps", 1e-6, above=_FLOAT32_TINY),
        tie_word_embeddings=hf.flag("tie_word_embeddings", False),
        head_dim=head_dim,
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        mlp_bias=hf.flag("mlp_bias", False),
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=hf.token_ids("eos_token_id"),
    )


def _context(declared: int, scaling: RopeScaling | None) -> int:
    """The context a scaled RoPE serves: ``linear`` and ``dynamic`` stretch
    ``max_position_embeddings`` by ``factor``, ``yarn`` the original context (as vLLM
    derives it); ``llama3`` checkpoints declare the stretched length already."""
    if scaling is None or scaling.rope_type == "llama3":
        return declared
    base = declared if scaling.rope_type in ("linear", "dynamic") else scaling.original_max_position
    return max(declared, min(MAX_CONTEXT, int(base * scaling.factor)))
