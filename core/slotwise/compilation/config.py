"""Compilation settings: one validated object, however the user spells it.

Every route (keywords, dict, JSON, file, ``SLOTWISE_COMPILATION_CONFIG``, ``-O`` flags)
ends in ``__post_init__``, so a mistake is reported the same way. Never imports torch.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import enum
import functools
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from slotwise import envs
from slotwise.config_error import ConfigError, rejected, shown
from slotwise.graph_mode import GraphMode
from slotwise.import_path import check_import_path

ENV_CONFIG = "SLOTWISE_COMPILATION_CONFIG"
ENV_CACHE_ROOT = "SLOTWISE_CACHE_ROOT"
ENV_DISABLE_CACHE = "SLOTWISE_DISABLE_COMPILE_CACHE"

#: What ``splitting_ops=None`` means: split the graph around attention.
DEFAULT_SPLITTING_OPS: list[str] = ["slotwise::unified_attention_with_output"]
#: Largest default capture size when neither ``capture_sizes`` nor a maximum is given.
DEFAULT_MAX_CAPTURE_SIZE = 512
DEFAULT_CACHE_DIR = "~/.cache/slotwise/compile"
#: Largest capture, compile or maximum capture size (tokens in a batch): a typo such as
#: 2000000000 fails at once instead of deriving a hundred million capture sizes.
MAX_SIZE = 65536
#: Most eager warm-up runs before a capture; lazy initialisation needs one or two.
MAX_GRAPH_WARMUPS = 100
#: Deepest nesting in an ``inductor_config`` value (a list that contains itself never ends).
MAX_JSON_DEPTH = 16
#: Largest compilation config file read, so a path such as /dev/zero is refused.
MAX_CONFIG_FILE_BYTES = 1024 * 1024

_OP_NAME = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")
_CUSTOM_OP_TOGGLE = re.compile(r"[+-][A-Za-z_][\w.]*")
_INDUCTOR_OPTION = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# NUL ends a C string (a path, an op name) early; a lone surrogate cannot be encoded.
_UNSAFE_CHAR = re.compile("[\x00\ud800-\udfff]")


class CompilationLevel(enum.IntEnum):
    """How much of the model torch.compile handles; each level does what the one below does."""

    NO_COMPILATION = 0
    DYNAMO_AS_IS = 1
    DYNAMO_ONCE = 2
    PIECEWISE = 3

    @classmethod
    def parse(cls, value: object) -> CompilationLevel:
        """Accept a member, an int 0-3, a digit string or a name in any case."""
        candidate = value
        if isinstance(value, str):
            text = value.strip()
            if text.upper() in cls.__members__:
                return cls[text.upper()]
            # Short: int() refuses thousands of digits with a ValueError of its own.
            if re.fullmatch(r"[0-9]{1,9}", text):
                candidate = int(text)
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            try:
                return cls(candidate)
            except ValueError:
                pass
        names = ", ".join(f"{level.value} ({level.name})" for level in cls)
        raise rejected("level", value, f"{names}, as an int, digit string or name in any case")


def _require_list(key: str, value: object, accepted: str) -> list[Any] | tuple[Any, ...]:
    # A string is iterable too, but "1,2" is never what a list-valued key meant.
    if not isinstance(value, (list, tuple)):
        raise rejected(key, value, accepted)
    return value


def _is_int_in(value: object, low: int, high: int) -> bool:
    """True ints only: Python counts True as 1, and 2.0, NaN or inf are floats."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_clean_text(value: object) -> bool:
    return isinstance(value, str) and not _UNSAFE_CHAR.search(value)


def _sizes(key: str, value: object) -> list[int]:
    accepted = f"a list of positive integers up to {MAX_SIZE} (not booleans)"
    sizes: set[int] = set()
    for size in _require_list(key, value, accepted):
        if not _is_int_in(size, 1, MAX_SIZE):
            raise rejected(key, size, accepted)
        sizes.add(size)
    return sorted(sizes)


def _count(key: str, value: object, maximum: int) -> int:
    if not _is_int_in(value, 0, maximum):
        raise rejected(key, value, f"a non-negative integer up to {maximum} (not a boolean)")
    return value


def _backend(value: object) -> str:
    accepted = '"" (platform default), "eager", "inductor" or "module:Class" of a compiler'
    if isinstance(value, str) and value in ("", "eager", "inductor"):
        return value
    if isinstance(value, str) and ":" in value:
        what = "compilation config key 'backend'"
        return check_import_path(value, what, fix=f"accepted: {accepted}", error=ConfigError)
    raise rejected("backend", value, accepted)


def _splitting_ops(value: object) -> list[str] | None:
    if value is None:
        return None
    accepted = 'null (the attention ops), [] (no split) or "ns::op" / "ns::op.overload" names'
    ops: list[str] = []
    for name in _require_list("splitting_ops", value, accepted):
        if not isinstance(name, str) or not _OP_NAME.fullmatch(name):
            raise rejected("splitting_ops", name, accepted)
        if name not in ops:
            ops.append(name)
    return ops


def _custom_ops(value: object) -> list[str]:
    accepted = 'a list of "all", "none", "+name" (enable) or "-name" (disable)'
    entries: list[str] = []
    for entry in _require_list("custom_ops", value, accepted):
        if not isinstance(entry, str) or not (
            entry in ("all", "none") or _CUSTOM_OP_TOGGLE.fullmatch(entry)
        ):
            raise rejected("custom_ops", entry, accepted)
        if entry not in entries:
            entries.append(entry)
    if "all" in entries and "none" in entries:
        raise rejected("custom_ops", entries, '"all" or "none", not both')
    enabled = {entry[1:] for entry in entries if entry[0] == "+"}
    disabled = {entry[1:] for entry in entries if entry[0] == "-"}
    both = sorted(enabled & disabled)
    if both:
        raise rejected("custom_ops", entries, f'"+{both[0]}" or "-{both[0]}", not both')
    return entries


def _json_data(key: str, value: object, depth: int = 0) -> Any:
    """Copy ``value``, insisting on JSON types (finite numbers, 64-bit ints) so to_dict()
    and compute_hash() are exact."""
    if value is None or isinstance(value, bool) or _is_clean_text(value):
        return value
    if _is_int_in(value, -(2**63), 2**63 - 1) or (
        isinstance(value, float) and math.isfinite(value)
    ):
        return value
    if depth < MAX_JSON_DEPTH:
        if isinstance(value, (list, tuple)):
            return [_json_data(key, item, depth + 1) for item in value]
        if isinstance(value, Mapping) and all(_is_clean_text(name) for name in value):
            return {
                name: _json_data(f"{key}.{name}", item, depth + 1) for name, item in value.items()
            }
    accepted = (
        "JSON data: text without NUL or lone surrogates, finite numbers, 64-bit integers, "
        f"booleans, null, lists, objects; nested at most {MAX_JSON_DEPTH} deep"
    )
    raise rejected(key, value, accepted)


def _inductor_config(value: object) -> dict[str, Any]:
    accepted = 'an object of Inductor option names ("max_autotune", "triton.cudagraphs") to values'
    if not isinstance(value, Mapping):
        raise rejected("inductor_config", value, accepted)
    for name in value:
        if not isinstance(name, str) or not _INDUCTOR_OPTION.fullmatch(name):
            raise rejected("inductor_config", name, accepted)
    return _json_data("inductor_config", value)


def _default_capture_sizes(max_size: int) -> list[int]:
    """Dense where batches are common (small decode batches), sparser as they grow."""
    candidates = [1, 2, 4, *range(8, 257, 8), *range(272, max_size + 1, 16)]
    return [size for size in candidates if size <= max_size]


_Class = TypeVar("_Class", bound=type)


def _strict_keywords(cls: _Class) -> _Class:
    """Make a misspelt keyword a ConfigError with a suggestion, not the dataclass TypeError."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: object, *args: object, **kwargs: Any) -> None:
        if args:
            raise ConfigError(
                f"{cls.__name__} takes keyword arguments only, got {shown(args)}; "
                f"{cls.__name__}.coerce() takes a dict, JSON text or a file path"
            )
        _check_keys(kwargs)
        init(self, **kwargs)

    cls.__init__ = __init__
    return cls


@_strict_keywords
@dataclass(kw_only=True)
class CompilationConfig:
    """Everything that decides how a model is compiled and which static graphs it captures;
    checked and normalised on construction, :meth:`replace` gives a changed copy."""

    level: CompilationLevel = CompilationLevel.PIECEWISE
    #: "" lets the platform choose; "eager", "inductor" or "module:Class" of a compiler.
    backend: str = ""
    #: None splits at DEFAULT_SPLITTING_OPS; [] keeps the graph whole.
    splitting_ops: list[str] | None = None
    custom_ops: list[str] = field(default_factory=list)
    #: Sizes that also get a specialised (static-shape) compile besides the general one.
    compile_sizes: list[int] = field(default_factory=list)
    #: Sizes whose static graphs are captured; None derives them from max_capture_size.
    capture_sizes: list[int] | None = None
    max_capture_size: int | None = None
    #: None takes ``graph_modes.default_graph_mode``: FULL_AND_PIECEWISE where the platform
    #: has static graphs and the attention may be captured, else PIECEWISE or NONE.
    graph_mode: GraphMode | None = None
    #: Eager runs before capture, so lazy initialisation stays out of the graph.
    graph_warmups: int = 1
    use_inductor_graph_partition: bool = False
    cache_dir: str = ""
    disable_cache: bool = False
    inductor_config: dict[str, Any] = field(default_factory=dict)
    #: Check input addresses on every replay, not only the first of each size.
    debug_checks: bool = False
    #: Copy batch-sized tensor inputs into the graph's own buffers before a replay.
    graph_copy_inputs: bool = False
    # Sizes filled in from defaults; replace() derives them again instead of freezing them.
    _derived: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.level = CompilationLevel.parse(self.level)
        self.backend = _backend(self.backend)
        self.splitting_ops = _splitting_ops(self.splitting_ops)
        self.custom_ops = _custom_ops(self.custom_ops)
        self.compile_sizes = _sizes("compile_sizes", self.compile_sizes)
        self._resolve_capture_sizes()
        if self.graph_mode is not None:
            self.graph_mode = GraphMode.parse(self.graph_mode)
        self.graph_warmups = _count("graph_warmups", self.graph_warmups, MAX_GRAPH_WARMUPS)
        for key in (
            "use_inductor_graph_partition",
            "disable_cache",
            "debug_checks",
            "graph_copy_inputs",
        ):
            if not isinstance(getattr(self, key), bool):
                raise rejected(key, getattr(self, key), "true or false")
        if self.graph_copy_inputs and self.use_inductor_graph_partition:
            # Inductor's partitions have no example inputs to tell batch inputs from weights.
            raise rejected(
                "graph_copy_inputs",
                True,
                "false with use_inductor_graph_partition (copy inputs into the captured "
                "buffers yourself, as slotwise_engine.runner does, or split with FX)",
            )
        if not _is_clean_text(self.cache_dir):
            accepted = 'a directory path without NUL or lone surrogates, or "" for the default'
            raise rejected("cache_dir", self.cache_dir, accepted)
        self.inductor_config = _inductor_config(self.inductor_config)

    def _resolve_capture_sizes(self) -> None:
        derived: set[str] = set()
        limit = self.max_capture_size
        if limit is not None:
            limit = _count("max_capture_size", limit, MAX_SIZE)
        if self.capture_sizes is None:
            if limit is None:
                limit = DEFAULT_MAX_CAPTURE_SIZE
                derived.add("max_capture_size")
            self.capture_sizes = _default_capture_sizes(limit)
            derived.add("capture_sizes")
        else:
            self.capture_sizes = _sizes("capture_sizes", self.capture_sizes)
            if limit is None:
                limit = max(self.capture_sizes, default=0)
                derived.add("max_capture_size")
            elif self.capture_sizes and self.capture_sizes[-1] > limit:
                accepted = f"sizes up to max_capture_size ({limit})"
                raise rejected("capture_sizes", self.capture_sizes[-1], accepted)
        self.max_capture_size = limit
        self._derived = frozenset(derived)

    @property
    def resolved_splitting_ops(self) -> list[str]:
        ops = DEFAULT_SPLITTING_OPS if self.splitting_ops is None else self.splitting_ops
        return list(ops)

    @property
    def resolved_cache_dir(self) -> str:
        root = self.cache_dir or envs.get(ENV_CACHE_ROOT) or DEFAULT_CACHE_DIR
        return os.path.expanduser(root)

    @property
    def cache_enabled(self) -> bool:
        """The environment can switch the cache off without anyone editing the config."""
        if self.disable_cache:
            return False
        try:
            return not envs.flag(ENV_DISABLE_CACHE)
        except ValueError as err:  # not a boolean; the message names the variable and value
            raise ConfigError(str(err)) from err

    def custom_op_enabled(self, name: str, resolved_backend: str | None = None) -> bool:
        """Whether custom op ``name`` uses its platform kernel rather than ``forward_native``
        (by default not under Inductor at level 3, which fuses native code better)."""
        if f"+{name}" in self.custom_ops:
            return True
        if f"-{name}" in self.custom_ops:
            return False
        if "all" in self.custom_ops:
            return True
        if "none" in self.custom_ops:
            return False
        backend = self.backend if resolved_backend is None else resolved_backend
        return not (self.level == CompilationLevel.PIECEWISE and backend == "inductor")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; ``from_dict`` of it gives an equal config."""
        data: dict[str, Any] = {}
        for spec in fields(self):
            if spec.init:
                value = getattr(self, spec.name)
                data[spec.name] = value.name if isinstance(value, enum.Enum) else value
        return copy.deepcopy(data)

    def replace(self, **changes: Any) -> CompilationConfig:
        """Validated copy with ``changes``; sizes that were defaulted are derived again."""
        data = {key: value for key, value in self.to_dict().items() if key not in self._derived}
        data.update(changes)
        return type(self)(**data)

    def compute_hash(self) -> str:
        """Hash of what changes compiled code, for cache keys; runtime-only knobs stay out."""
        factors = {
            "level": self.level.name,
            "backend": self.backend,
            "splitting_ops": self.resolved_splitting_ops,
            "custom_ops": sorted(self.custom_ops),
            "compile_sizes": self.compile_sizes,
            "use_inductor_graph_partition": self.use_inductor_graph_partition,
            "inductor_config": self.inductor_config,
            "graph_mode": None if self.graph_mode is None else self.graph_mode.name,
        }
        canonical = json.dumps(factors, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompilationConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"a compilation config must be a mapping/JSON object, got {shown(data)}"
            )
        _check_keys(data)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> CompilationConfig:
        return cls.from_dict(_json_object(text, "compilation config JSON"))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CompilationConfig:
        """Load a JSON file; ``~`` is expanded."""
        data, shown = _read_json_file(path)
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"in {shown}: {err}") from err

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CompilationConfig:
        """Read SLOTWISE_COMPILATION_CONFIG: a JSON object or a JSON file's path."""
        return cls.from_dict(_env_data(environ))

    @classmethod
    def from_env_and_cli(
        cls, flags: Iterable[str], environ: Mapping[str, str] | None = None
    ) -> CompilationConfig:
        """SLOTWISE_COMPILATION_CONFIG with the ``-O`` flags laid over it key by key."""
        return cls._from_flags(_env_data(environ), flags)

    @classmethod
    def from_cli(cls, flags: Iterable[str]) -> CompilationConfig:
        """Combine ``-O`` values in order, later ones overriding earlier ones: a level,
        ``.key=value`` (a JSON value or else the raw string) or a JSON object."""
        return cls._from_flags({}, flags)

    @classmethod
    def _from_flags(cls, data: dict[str, Any], flags: Iterable[str]) -> CompilationConfig:
        for flag in flags:
            _apply_flag(data, flag)
        return cls.from_dict(data)

    @staticmethod
    def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "-O",
            "--compilation-config",
            action="append",
            dest="compilation_config",
            metavar="CONFIG",
            help=(
                "compilation setting, repeatable, later wins: a level (-O3), .key=value "
                "(-O.graph_mode=PIECEWISE, -O.capture_sizes=[1,2,4]) or a JSON object"
            ),
        )

    @classmethod
    def from_cli_namespace(cls, namespace: argparse.Namespace) -> CompilationConfig:
        """The environment's config with the namespace's ``-O`` flags over it."""
        return cls.from_env_and_cli(getattr(namespace, "compilation_config", None) or [])

    @classmethod
    def coerce(cls, obj: object) -> CompilationConfig:
        """Build from whatever a caller passed; None means "what the environment says"."""
        if obj is None:
            return cls.from_env()
        if isinstance(obj, cls):
            return obj
        if isinstance(obj, Mapping):
            return cls.from_dict(obj)
        if isinstance(obj, int) and not isinstance(obj, bool):
            return cls(level=CompilationLevel.parse(obj))
        if isinstance(obj, str) and obj.strip().startswith("{"):
            return cls.from_json(obj)
        if isinstance(obj, (str, os.PathLike)):
            return cls.from_file(obj)
        raise ConfigError(
            f"cannot build a CompilationConfig from {shown(obj)}; accepted: None, a "
            "CompilationConfig, a dict, a JSON object string, a JSON file path or a level int"
        )


_KEYS = tuple(spec.name for spec in fields(CompilationConfig) if spec.init)


def _check_keys(data: Mapping[Any, Any]) -> None:
    for key in data:
        if key not in _KEYS:
            raise _unknown_key(key)


def _unknown_key(key: object) -> ConfigError:
    matches = difflib.get_close_matches(key, _KEYS, n=1) if isinstance(key, str) else []
    hint = f" (did you mean {matches[0]!r}?)" if matches else ""
    return ConfigError(
        f"unknown compilation config key {shown(key)}{hint}; accepted keys: {', '.join(_KEYS)}"
    )


def _read_json_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """The JSON object in ``path`` (``~`` expanded) and the path as error messages show it."""
    name = os.path.expanduser(os.fspath(path))
    display = shown(name)
    try:
        text = _read_config_file(name, display)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(f"compilation config file {display} does not exist") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the name, or not UTF-8
        # strerror leaves out the name, which may be too long to show twice.
        reason = getattr(err, "strerror", None) or err
        raise ConfigError(f"cannot read compilation config file {display}: {reason}") from err
    return _json_object(text, f"compilation config file {display}"), display


def _read_config_file(name: str, display: str) -> str:
    """The text of the regular file ``name``, at most MAX_CONFIG_FILE_BYTES long; opened
    without blocking, so a FIFO is refused instead of waiting for a writer."""
    descriptor = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ConfigError(
                f"compilation config file {display} is not a regular file (a folder, device, "
                "FIFO or socket); point it at a JSON file"
            )
        data = file.read(MAX_CONFIG_FILE_BYTES + 1)
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(
            f"compilation config file {display} is larger than {MAX_CONFIG_FILE_BYTES} bytes "
            "(1 MiB); a compilation config is a small JSON object"
        )
    return data.decode("utf-8")


def _env_data(environ: Mapping[str, str] | None) -> dict[str, Any]:
    """The settings of SLOTWISE_COMPILATION_CONFIG, checked, as a dict to build on."""
    raw = (os.environ if environ is None else environ).get(ENV_CONFIG, "").strip()
    if not raw:
        return {}
    try:
        if raw.startswith("{"):
            data, where = _json_object(raw, "compilation config JSON"), ""
        else:
            data, shown = _read_json_file(raw)
            where = f"in {shown}: "
        try:
            CompilationConfig.from_dict(data)  # checked here, so errors name the variable
        except ConfigError as err:
            raise ConfigError(f"{where}{err}") from err
    except ConfigError as err:
        raise ConfigError(f"{ENV_CONFIG}: {err}") from err
    return dict(data)


def _json_object(text: object, source: str) -> dict[str, Any]:
    if not isinstance(text, str):
        raise ConfigError(f"{source} must be a string, got {shown(text)}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:  # also too many digits, or too deep
        raise ConfigError(f"{source} is not valid JSON ({err}): {shown(text)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a JSON object, got {shown(data)}")
    return data


def _apply_flag(data: dict[str, Any], flag: str) -> None:
    if not isinstance(flag, str):
        raise ConfigError(f"-O values must be strings, got {shown(flag)}")
    text = flag.strip()
    if text.startswith("{"):
        data.update(_json_object(text, f"-O {shown(flag)}"))
        return
    if not text.startswith("."):
        try:
            data["level"] = CompilationLevel.parse(text)
        except ConfigError:
            raise ConfigError(
                f"-O {shown(flag)}: accepted: a level (0-3 or its name), .key=value or a JSON "
                "object"
            ) from None
        return
    path, equals, raw = text[1:].partition("=")
    if not equals or not path:
        raise ConfigError(f"-O {shown(flag)}: accepted: .key=value, e.g. -O.level=3")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = raw  # -O.backend=eager: a bare word is a string
    key, dot, option = path.partition(".")
    if key not in _KEYS:
        raise _unknown_key(key)
    if not dot:
        data[key] = value
    elif key == "inductor_config":
        # Inductor's own option names contain dots ("triton.cudagraphs"): keep them whole.
        options = data.get(key)
        data[key] = {**(options if isinstance(options, dict) else {}), option: value}
    else:
        raise ConfigError(
            f"-O {shown(flag)}: key {key!r} has no sub-keys; only inductor_config does"
        )
