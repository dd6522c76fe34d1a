"""Random and hostile input through every CompilationConfig builder.

Whatever a user types, the only exception may be ConfigError (with a message short enough
to read), and whatever is accepted must survive to_dict() and JSON unchanged.
"""

from __future__ import annotations

import json
import random
import reprlib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from slotwise.compilation.config import CompilationConfig, CompilationLevel, ConfigError

SEED = 1234
CASES = 3000
ENV = "SLOTWISE_COMPILATION_CONFIG"
KEYS = [spec.name for spec in fields(CompilationConfig) if spec.init]
Build = Callable[[], CompilationConfig]

NAN, INF = float("nan"), float("inf")
NUMBERS: list[object] = [
    *(0, 1, 2, 3, 4, -1, 8, 512, 65536, 65537, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30),
    *(10**5000, 0.0, -0.0, 0.5, 2.0, 1e300, -1e300, NAN, INF, -INF, True, False, None),
]
TEXTS: list[object] = [
    *("", "eager", "inductor", "pkg.mod:Compiler", "aten::mm.default", "PIECEWISE", "full"),
    *("all", "none", "+rms_norm", "-rms_norm", "3", " piecewise ", "/tmp/cache", "~/c"),
    *("a\x00b", "\ud800", "x\udcff", "NaN", "1e400", "[1, 2]", "{}", "9" * 5000, "é", "\n"),
]
OPTION_NAMES = ["max_autotune", "triton.cudagraphs", "", " x", "1x", "a..b", "a\x00", "\ud800"]
# Mostly valid values per key, so that many cases build a config and test the round trip.
PLAUSIBLE: dict[str, list[object]] = {
    "level": [0, 1, 2, 3, "piecewise", "DYNAMO_ONCE", " 2 ", CompilationLevel.PIECEWISE],
    "backend": ["", "eager", "inductor", "pkg.mod:Compiler"],
    "splitting_ops": [None, [], ["aten::mm.default"], ["a::b", "a::b", "c::d.default"]],
    "custom_ops": [[], ["all"], ["none", "+rms_norm"], ["-silu_and_mul"]],
    "compile_sizes": [[], [1, 8], [65536], [4, 4, 2]],
    "capture_sizes": [None, [], [1, 2, 4], [16, 1], [65536]],
    "max_capture_size": [None, 0, 1, 16, 300, 512, 65536],
    "graph_mode": [None, "NONE", "piecewise", "FULL", "full_and_piecewise"],
    "graph_warmups": [0, 1, 2, 100],
    "use_inductor_graph_partition": [True, False],
    "cache_dir": ["", "/tmp/c", "~/x"],
    "disable_cache": [True, False],
    "inductor_config": [{}, {"max_autotune": True}, {"triton.cudagraphs": False, "x": [1, {}]}],
    "debug_checks": [True, False],
    "graph_copy_inputs": [True, False],
}
JUNK_FLAGS = ["3", "fast", "{", ".level", ".level.x=1", "", "-O3", '{"level": 1}', "{1: 2}"]


def _garbage(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if roll < 0.4:
        return rng.choice(NUMBERS)
    if roll < 0.7 or depth >= 3:
        return rng.choice(TEXTS)
    if roll < 0.85:
        return [_garbage(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(OPTION_NAMES): _garbage(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _key(rng: random.Random) -> str:
    key = rng.choice(KEYS)
    roll = rng.random()
    if roll < 0.8:
        return key
    if roll < 0.95:  # a near miss, as a typing user makes them
        cut = rng.randrange(len(key))
        return rng.choice(
            [key[:cut] + key[cut + 1 :], key + "s", key.upper(), key.replace("_", "-"), f" {key}"]
        )
    return rng.choice(["", "\x00", "\ud800", "zzz", "_derived", "level.x"])


def _data(rng: random.Random) -> dict[str, object]:
    data: dict[str, object] = {}
    for _ in range(rng.randint(0, 5)):
        key = _key(rng)
        values = PLAUSIBLE.get(key)
        data[key] = rng.choice(values) if values and rng.random() < 0.7 else _garbage(rng)
    return data


def _json(rng: random.Random, data: object) -> str:
    """JSON text of ``data`` (NaN and all), sometimes cut short or with a stray character."""
    try:
        text = json.dumps(data)
    except (TypeError, ValueError):  # a tuple key, an int of thousands of digits
        text = "{}"
    roll = rng.random()
    if roll < 0.1:
        return text[: rng.randrange(len(text) + 1)]
    if roll < 0.2:
        cut = rng.randrange(len(text) + 1)
        return text[:cut] + rng.choice("{}[],:\"'x9-.") + text[cut:]
    return text


def _flags(rng: random.Random, data: dict[str, object]) -> list[str]:
    flags = []
    for key, value in data.items():
        if key == "inductor_config" and isinstance(value, dict) and rng.random() < 0.5:
            flags += [f".{key}.{name}={_json(rng, item)}" for name, item in value.items()]
        elif isinstance(value, str) and rng.random() < 0.5:
            flags.append(f".{key}={value}")  # bare words are strings
        else:
            flags.append(f".{key}={_json(rng, value)}")
    if rng.random() < 0.2:
        flags.insert(rng.randrange(len(flags) + 1), rng.choice(JUNK_FLAGS))
    return flags


def _builder(
    rng: random.Random, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: int
) -> tuple[str, object, Build]:
    """A builder picked at random, what it is given (for failure messages) and the call."""
    data = _data(rng)
    path = tmp_path / f"{case}.json"
    kind = rng.choice(["kwargs", "dict", "coerce", "json", "file", "env", "env_file", "flags"])
    if kind == "kwargs":
        return kind, data, lambda: CompilationConfig(**data)
    if kind == "dict":
        if rng.random() < 0.1:
            data[rng.choice([1, None, ("t",)])] = 1  # type: ignore[index]
        return kind, data, lambda: CompilationConfig.from_dict(data)
    if kind == "coerce":
        obj = rng.choice([data, _json(rng, data), _garbage(rng)])
        return kind, obj, lambda: CompilationConfig.coerce(obj)
    text = _json(rng, data)
    if kind == "json":
        return kind, text, lambda: CompilationConfig.from_json(text)
    if kind in ("file", "env_file"):
        if rng.random() < 0.05:
            path.write_bytes(b"\xff\xfe" + text.encode())
        else:
            path.write_text(text, encoding="utf-8")
        if kind == "file":
            return kind, text, lambda: CompilationConfig.from_file(path)
        monkeypatch.setenv(ENV, str(path))
        return kind, text, CompilationConfig.from_env
    if kind == "env":
        monkeypatch.setenv(ENV, text)
        return kind, text, lambda: CompilationConfig.coerce(None)
    flags = _flags(rng, data)
    return kind, flags, lambda: CompilationConfig.from_cli(flags)


def _assert_round_trips(config: CompilationConfig) -> None:
    data = config.to_dict()
    again = CompilationConfig.coerce(data)
    assert again == config
    assert again.compute_hash() == config.compute_hash()
    assert CompilationConfig.from_json(json.dumps(data, allow_nan=False)) == config


def _describe(obj: object) -> str:
    try:
        return reprlib.repr(obj)
    except ValueError:
        return f"<{type(obj).__name__}>"


def test_only_config_errors_escape_and_accepted_configs_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (ENV, "SLOTWISE_CACHE_ROOT", "SLOTWISE_DISABLE_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(SEED)
    outcomes = {"built": 0, "rejected": 0}
    for case in range(CASES):
        kind, given, build = _builder(rng, tmp_path, monkeypatch, case)
        try:
            config = build()
        except ConfigError as err:
            assert len(str(err)) < 1500, f"case {case} via {kind}: message of {len(str(err))}"
            outcomes["rejected"] += 1
            continue
        except Exception as err:  # noqa: BLE001 - the point: name the input that broke it
            pytest.fail(
                f"case {case} via {kind}: {type(err).__name__}: {err} from {_describe(given)}"
            )
        _assert_round_trips(config)
        for key in rng.sample(KEYS, 2):
            try:
                _assert_round_trips(config.replace(**{key: _garbage(rng)}))
            except ConfigError:
                pass
        outcomes["built"] += 1
    # Both paths must be exercised for the test to mean anything.
    assert outcomes["built"] > CASES // 10 and outcomes["rejected"] > CASES // 10, outcomes
