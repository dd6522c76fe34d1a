from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slotwise.compilation.config import (
    DEFAULT_SPLITTING_OPS,
    MAX_CONFIG_FILE_BYTES,
    MAX_GRAPH_WARMUPS,
    MAX_SIZE,
    CompilationConfig,
    CompilationLevel,
    ConfigError,
    GraphMode,
)

CORE = Path(__file__).resolve().parents[2] / "core"

SAMPLE = {
    "level": 3,
    "backend": "eager",
    "splitting_ops": ["slotwise::unified_attention_with_output", "aten::mm.default"],
    "custom_ops": ["none", "+rms_norm"],
    "compile_sizes": [8, 1],
    "capture_sizes": [1, 2, 4, 8],
    "graph_mode": "PIECEWISE",
    "graph_warmups": 2,
    "inductor_config": {"max_autotune": True},
    "debug_checks": True,
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "SLOTWISE_COMPILATION_CONFIG",
        "SLOTWISE_CACHE_ROOT",
        "SLOTWISE_DISABLE_COMPILE_CACHE",
    ):
        monkeypatch.delenv(name, raising=False)


def _python(code: str) -> str:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLOTWISE_")}
    env["PYTHONPATH"] = str(CORE)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


# -- builders ---------------------------------------------------------------------------


def test_every_builder_gives_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "compile.json"
    path.write_text(json.dumps(SAMPLE))
    text = json.dumps(SAMPLE)
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", text)
    flags = [f".{key}={json.dumps(value)}" for key, value in SAMPLE.items()]

    expected = CompilationConfig(**SAMPLE)
    built = [
        CompilationConfig.from_dict(SAMPLE),
        CompilationConfig.from_json(text),
        CompilationConfig.from_file(path),
        CompilationConfig.from_file(str(path)),
        CompilationConfig.from_env(),
        CompilationConfig.from_env({"SLOTWISE_COMPILATION_CONFIG": str(path)}),
        CompilationConfig.from_cli(flags),
        CompilationConfig.from_cli([text]),
        CompilationConfig.coerce(SAMPLE),
        CompilationConfig.coerce(text),
        CompilationConfig.coerce(str(path)),
        CompilationConfig.coerce(path),
        CompilationConfig.coerce(None),
        CompilationConfig.from_dict(expected.to_dict()),
    ]
    for config in built:
        assert config == expected
    assert CompilationConfig.coerce(expected) is expected


def test_to_dict_is_json_with_enum_names() -> None:
    data = CompilationConfig(**SAMPLE).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["level"] == "PIECEWISE"
    assert data["graph_mode"] == "PIECEWISE"
    assert data["compile_sizes"] == [1, 8]


def test_coerce_int_is_a_level() -> None:
    assert CompilationConfig.coerce(0).level is CompilationLevel.NO_COMPILATION


def test_env_unset_or_empty_gives_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CompilationConfig.from_env() == CompilationConfig()
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", "  ")
    assert CompilationConfig.from_env() == CompilationConfig()
    assert CompilationConfig.coerce(None) == CompilationConfig()


def test_env_json_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", '{"level": 1, "backend": "inductor"}')
    config = CompilationConfig.from_env()
    assert (config.level, config.backend) == (CompilationLevel.DYNAMO_AS_IS, "inductor")

    path = tmp_path / "c.json"
    path.write_text('{"graph_mode": "full"}')
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", str(path))
    assert CompilationConfig.from_env().graph_mode is GraphMode.FULL


def test_kwargs_accept_loose_spellings() -> None:
    config = CompilationConfig(level="piecewise", graph_mode="full_and_piecewise")
    assert config.level is CompilationLevel.PIECEWISE
    assert config.graph_mode is GraphMode.FULL_AND_PIECEWISE
    assert CompilationConfig(level=3, graph_mode="piecewise").graph_mode is GraphMode.PIECEWISE


# -- defaults and normalisation ---------------------------------------------------------


def test_defaults() -> None:
    config = CompilationConfig()
    assert config.level is CompilationLevel.PIECEWISE
    assert config.backend == ""
    assert config.splitting_ops is None
    assert config.resolved_splitting_ops == DEFAULT_SPLITTING_OPS
    assert DEFAULT_SPLITTING_OPS == ["slotwise::unified_attention_with_output"]
    assert config.graph_mode is None
    assert config.graph_warmups == 1
    assert config.custom_ops == config.compile_sizes == []
    assert config.inductor_config == {}
    assert config.cache_enabled


def test_default_capture_sizes() -> None:
    config = CompilationConfig()
    sizes = config.capture_sizes
    assert sizes is not None
    assert sizes[:6] == [1, 2, 4, 8, 16, 24]
    assert 256 in sizes and 272 in sizes and 264 not in sizes
    assert sizes == sorted(set(sizes))
    assert max(sizes) == config.max_capture_size == 512
    assert len(sizes) == 3 + 256 // 8 + (512 - 256) // 16


def test_max_capture_size_bounds_default_capture_sizes() -> None:
    config = CompilationConfig(max_capture_size=300)
    assert config.capture_sizes is not None and config.capture_sizes[-3:] == [256, 272, 288]
    assert config.max_capture_size == 300


def test_given_capture_sizes_set_max_and_are_normalised() -> None:
    config = CompilationConfig(capture_sizes=[16, 4, 4, 1])
    assert config.capture_sizes == [1, 4, 16]
    assert config.max_capture_size == 16
    assert CompilationConfig(capture_sizes=[]).max_capture_size == 0


def test_replace_validates_and_rederives_defaulted_sizes() -> None:
    config = CompilationConfig()
    smaller = config.replace(max_capture_size=16)
    assert smaller.capture_sizes == [1, 2, 4, 8, 16]
    assert config.max_capture_size == 512
    assert CompilationConfig(capture_sizes=[2, 4]).replace(graph_warmups=3).max_capture_size == 4
    with pytest.raises(ConfigError, match="graph_warmups"):
        config.replace(graph_warmups=-1)
    with pytest.raises(ConfigError, match="did you mean 'backend'"):
        config.replace(backnd="eager")


def test_splitting_ops_keep_order_and_drop_duplicates() -> None:
    ops = ["b::y", "a::x.default", "b::y"]
    assert CompilationConfig(splitting_ops=ops).splitting_ops == ["b::y", "a::x.default"]
    assert CompilationConfig(splitting_ops=[]).resolved_splitting_ops == []


def test_compile_sizes_sorted_and_deduplicated() -> None:
    assert CompilationConfig(compile_sizes=[8, 1, 8]).compile_sizes == [1, 8]


def test_cache_dir_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert CompilationConfig().resolved_cache_dir == str(tmp_path / ".cache/slotwise/compile")
    monkeypatch.setenv("SLOTWISE_CACHE_ROOT", "/srv/cache")
    assert CompilationConfig().resolved_cache_dir == "/srv/cache"
    assert CompilationConfig(cache_dir="~/c").resolved_cache_dir == str(tmp_path / "c")


@pytest.mark.parametrize(
    ("disable_cache", "env", "enabled"),
    [(False, None, True), (True, None, False), (False, "1", False), (False, "0", True)],
)
def test_cache_enabled(
    monkeypatch: pytest.MonkeyPatch, disable_cache: bool, env: str | None, enabled: bool
) -> None:
    if env is not None:
        monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", env)
    config = CompilationConfig(disable_cache=disable_cache)
    assert config.cache_enabled is enabled
    assert config.disable_cache is disable_cache


# -- enums ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "level"),
    [(0, 0), (3, 3), ("2", 2), (" 1 ", 1), ("piecewise", 3), ("Dynamo_Once", 2)],
)
def test_level_parsing(value: object, level: int) -> None:
    assert CompilationLevel.parse(value) == level


def test_graph_mode_kinds() -> None:
    assert [m for m in GraphMode if m.has_full_graphs] == [
        GraphMode.FULL,
        GraphMode.FULL_AND_PIECEWISE,
    ]
    assert [m for m in GraphMode if m.has_piecewise_graphs] == [
        GraphMode.PIECEWISE,
        GraphMode.FULL_AND_PIECEWISE,
    ]
    assert GraphMode.runtime_modes() == (GraphMode.NONE, GraphMode.PIECEWISE, GraphMode.FULL)
    assert not GraphMode.FULL_AND_PIECEWISE.is_runtime_mode
    assert GraphMode.parse("Full") is GraphMode.FULL
    assert GraphMode.FULL.value == "FULL"


# -- custom ops -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "backend", "resolved", "enabled"),
    [
        (3, "inductor", None, False),
        (3, "eager", None, True),
        (3, "", None, True),
        (3, "", "inductor", False),
        (3, "inductor", "eager", True),
        (2, "inductor", None, True),
        (0, "", "inductor", True),
    ],
)
def test_custom_op_default_rule(
    level: int, backend: str, resolved: str | None, enabled: bool
) -> None:
    config = CompilationConfig(level=level, backend=backend)
    assert config.custom_op_enabled("rms_norm", resolved) is enabled


@pytest.mark.parametrize(
    ("custom_ops", "name", "enabled"),
    [
        (["all"], "rms_norm", True),
        (["none"], "rms_norm", False),
        (["none", "+rms_norm"], "rms_norm", True),
        (["none", "+rms_norm"], "silu_and_mul", False),
        (["all", "-rms_norm"], "rms_norm", False),
        (["+rms_norm"], "silu_and_mul", False),  # others keep the Inductor default
        (["+rms_norm"], "rms_norm", True),
    ],
)
def test_custom_op_overrides(custom_ops: list[str], name: str, enabled: bool) -> None:
    config = CompilationConfig(level=3, backend="eager", custom_ops=custom_ops)
    assert config.custom_op_enabled(name, "inductor") is enabled


# -- -O flags ---------------------------------------------------------------------------


def _parse(argv: list[str]) -> CompilationConfig:
    parser = argparse.ArgumentParser()
    CompilationConfig.add_cli_arguments(parser)
    return CompilationConfig.from_cli_namespace(parser.parse_args(argv))


def test_cli_forms() -> None:
    config = _parse(
        [
            "-O1",
            "-O.graph_mode=PIECEWISE",
            "-O.capture_sizes=[1,2,4]",
            "-O.backend=eager",
            "-O.inductor_config.max_autotune=true",
            "--compilation-config=.inductor_config.triton.cudagraphs=false",
            "-O.splitting_ops=[]",
        ]
    )
    assert config.level is CompilationLevel.DYNAMO_AS_IS
    assert config.graph_mode is GraphMode.PIECEWISE
    assert config.capture_sizes == [1, 2, 4]
    assert config.backend == "eager"
    assert config.inductor_config == {"max_autotune": True, "triton.cudagraphs": False}
    assert config.splitting_ops == []


def test_cli_json_object_and_later_flags_win() -> None:
    assert _parse(["-O", '{"level": 2, "backend": "eager"}', "-O3"]) == CompilationConfig(
        level=3, backend="eager"
    )
    assert _parse(["-O3", "-O", '{"level": 0}']).level is CompilationLevel.NO_COMPILATION
    assert _parse(["-O.backend=mypkg.comp:Compiler"]).backend == "mypkg.comp:Compiler"
    assert _parse(["-OPIECEWISE"]).level is CompilationLevel.PIECEWISE


def test_no_flags_give_defaults() -> None:
    assert _parse([]) == CompilationConfig()
    assert CompilationConfig.from_cli([]) == CompilationConfig()


@pytest.mark.parametrize(
    ("flag", "fragment"),
    [
        ("fast", "a level (0-3"),
        (".graph_mode", ".key=value"),
        (".level.x=1", "only inductor_config"),
        (".levl=3", "did you mean 'level'"),
        ("{not json", "not valid JSON"),
    ],
)
def test_cli_errors(flag: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        CompilationConfig.from_cli([flag])


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"level": 5}, ["'level'", "5", "3 (PIECEWISE)"]),
        ({"level": True}, ["'level'", "True", "0 (NO_COMPILATION)"]),
        ({"level": "fast"}, ["'level'", "'fast'", "DYNAMO_ONCE"]),
        ({"graph_mode": "partial"}, ["'graph_mode'", "'partial'", "FULL_AND_PIECEWISE"]),
        ({"splitting_ops": ["attention"]}, ["'splitting_ops'", "'attention'", "ns::op"]),
        ({"splitting_ops": "a::b"}, ["'splitting_ops'", "'a::b'", "ns::op.overload"]),
        ({"compile_sizes": [4, -1]}, ["'compile_sizes'", "-1", "positive integers"]),
        ({"capture_sizes": [0]}, ["'capture_sizes'", "0", "positive integers"]),
        ({"compile_sizes": [True]}, ["'compile_sizes'", "True", "not booleans"]),
        ({"graph_warmups": True}, ["'graph_warmups'", "True", "non-negative integer"]),
        ({"graph_warmups": -1}, ["'graph_warmups'", "-1", "non-negative integer"]),
        ({"max_capture_size": -8}, ["'max_capture_size'", "-8", "non-negative integer"]),
        (
            {"capture_sizes": [1, 1024], "max_capture_size": 512},
            ["'capture_sizes'", "1024", "max_capture_size (512)"],
        ),
        ({"custom_ops": ["all", "none"]}, ["'custom_ops'", "'none'", '"all" or "none"']),
        ({"custom_ops": ["+x", "-x"]}, ["'custom_ops'", "'-x'", '"+x" or "-x", not both']),
        ({"custom_ops": ["rms_norm"]}, ["'custom_ops'", "'rms_norm'", '"+name"']),
        ({"backend": "aot_eager"}, ["'backend'", "'aot_eager'", '"inductor"', "module:Class"]),
        ({"backend": "pkg:"}, ["'backend'", "'pkg:'", "module:Class"]),
        ({"debug_checks": 1}, ["'debug_checks'", "1", "true or false"]),
        ({"graph_copy_inputs": "yes"}, ["'graph_copy_inputs'", "'yes'", "true or false"]),
        (
            {"graph_copy_inputs": True, "use_inductor_graph_partition": True},
            ["'graph_copy_inputs'", "True", "false with use_inductor_graph_partition"],
        ),
        ({"disable_cache": "true"}, ["'disable_cache'", "'true'", "true or false"]),
        ({"cache_dir": None}, ["'cache_dir'", "None", "directory path"]),
        ({"inductor_config": [1]}, ["'inductor_config'", "[1]", "Inductor option"]),
        ({"inductor_config": {"f": print}}, ["'inductor_config.f'", "print", "JSON data"]),
        # Too big, or not really an int: bounded, and never a list of a billion sizes.
        ({"max_capture_size": 2**63}, ["'max_capture_size'", str(2**63), f"up to {MAX_SIZE}"]),
        ({"max_capture_size": 2_000_000_000}, ["'max_capture_size'", "2000000000", "65536"]),
        ({"max_capture_size": MAX_SIZE + 1}, ["'max_capture_size'", "65537", "up to 65536"]),
        ({"max_capture_size": 1e300}, ["'max_capture_size'", "1e+300", "non-negative integer"]),
        ({"max_capture_size": 512.0}, ["'max_capture_size'", "512.0", "non-negative integer"]),
        ({"max_capture_size": True}, ["'max_capture_size'", "True", "not a boolean"]),
        ({"capture_sizes": [1, 10**30]}, ["'capture_sizes'", str(10**30), "up to 65536"]),
        ({"capture_sizes": [float("inf")]}, ["'capture_sizes'", "inf", "positive integers"]),
        ({"capture_sizes": [2.0]}, ["'capture_sizes'", "2.0", "positive integers"]),
        ({"compile_sizes": [float("nan")]}, ["'compile_sizes'", "nan", "positive integers"]),
        ({"compile_sizes": [MAX_SIZE + 1]}, ["'compile_sizes'", "65537", "up to 65536"]),
        ({"graph_warmups": MAX_GRAPH_WARMUPS + 1}, ["'graph_warmups'", "101", "up to 100"]),
        ({"graph_warmups": 10**30}, ["'graph_warmups'", str(10**30), "up to 100"]),
        ({"graph_warmups": 1.0}, ["'graph_warmups'", "1.0", "non-negative integer"]),
        ({"level": 10**30}, ["'level'", str(10**30), "3 (PIECEWISE)"]),
        ({"level": float("nan")}, ["'level'", "nan", "3 (PIECEWISE)"]),
        ({"level": 3.0}, ["'level'", "3.0", "3 (PIECEWISE)"]),
        ({"level": "9" * 5000}, ["'level'", "9999", "digit string"]),
        # NUL ends a C string early; a lone surrogate cannot be encoded at all.
        ({"cache_dir": "/tmp/a\x00b"}, ["'cache_dir'", "\\x00", "without NUL"]),
        ({"cache_dir": "\ud800"}, ["'cache_dir'", "\\ud800", "lone surrogates"]),
        ({"backend": "a:b\x00"}, ["'backend'", "\\x00", "module:Class"]),
        ({"splitting_ops": ["a::b\x00"]}, ["'splitting_ops'", "\\x00", "ns::op"]),
        ({"splitting_ops": ["a::\udc80"]}, ["'splitting_ops'", "\\udc80", "ns::op"]),
        ({"inductor_config": {"": 1}}, ["'inductor_config'", "''", "option names"]),
        ({"inductor_config": {"a\x00": 1}}, ["'inductor_config'", "\\x00", "option names"]),
        ({"inductor_config": {"\ud800": 1}}, ["'inductor_config'", "\\ud800", "option names"]),
        ({"inductor_config": {"a.": 1}}, ["'inductor_config'", "'a.'", "triton.cudagraphs"]),
        ({"inductor_config": {"a": "x\x00"}}, ["'inductor_config.a'", "\\x00", "without NUL"]),
        ({"inductor_config": {"a": {"\ud800": 1}}}, ["'inductor_config.a'", "lone surrogates"]),
        ({"inductor_config": {"a": float("nan")}}, ["'inductor_config.a'", "nan", "finite"]),
        ({"inductor_config": {"a": [float("-inf")]}}, ["'inductor_config.a'", "-inf", "finite"]),
        ({"inductor_config": {"a": 2**64}}, ["'inductor_config.a'", str(2**64), "64-bit"]),
        ({"inductor_config": {"a": 10**5000}}, ["'inductor_config.a'", "int too large to show"]),
    ],
)
def test_bad_values_name_key_value_and_accepted(
    kwargs: dict[str, object], fragments: list[str]
) -> None:
    for build in (lambda: CompilationConfig(**kwargs), lambda: CompilationConfig.from_dict(kwargs)):
        with pytest.raises(ConfigError) as info:
            build()
        for fragment in fragments:
            assert fragment in str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_error_messages_stay_short_for_huge_values() -> None:
    for build in (
        lambda: CompilationConfig(capture_sizes=[list(range(10**6))]),
        lambda: CompilationConfig(backend="x" * 10**6),
        lambda: CompilationConfig.from_cli(["x" * 10**6]),
    ):
        with pytest.raises(ConfigError) as info:
            build()
        assert len(str(info.value)) < 1000


def test_self_containing_or_deep_inductor_values() -> None:
    loop: list[object] = []
    loop.append(loop)
    deep: object = 1
    for _ in range(100):
        deep = [deep]
    for value in (loop, deep):
        with pytest.raises(ConfigError, match=r"'inductor_config\.a'.*nested at most 16 deep"):
            CompilationConfig(inductor_config={"a": value})
    assert CompilationConfig(inductor_config={"a": [[{"b": [1.5, None]}]]}).inductor_config


def test_largest_sizes_are_accepted() -> None:
    config = CompilationConfig(max_capture_size=MAX_SIZE, graph_warmups=MAX_GRAPH_WARMUPS)
    assert config.capture_sizes is not None and config.capture_sizes[-1] == MAX_SIZE
    assert CompilationConfig(compile_sizes=[MAX_SIZE]).compile_sizes == [MAX_SIZE]


def test_unknown_keyword_is_a_config_error_with_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig(capture_size=[1])  # type: ignore[call-arg]
    assert "'capture_size'" in str(info.value)
    assert "did you mean 'capture_sizes'?" in str(info.value)
    with pytest.raises(ConfigError, match="keyword arguments only.*coerce"):
        CompilationConfig({"level": 3})  # type: ignore[misc]
    # The wrapper keeps the dataclass signature for help() and IDEs.
    assert "capture_sizes" in inspect.signature(CompilationConfig).parameters


def test_junk_disable_cache_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "junk")
    with pytest.raises(ConfigError, match="SLOTWISE_DISABLE_COMPILE_CACHE='junk'"):
        _ = CompilationConfig().cache_enabled
    assert not CompilationConfig(disable_cache=True).cache_enabled  # the variable is not read


@pytest.mark.parametrize(
    ("flag", "fragments"),
    [
        (".max_capture_size=9223372036854775808", ["'max_capture_size'", "up to 65536"]),
        (".max_capture_size=1e300", ["'max_capture_size'", "1e+300"]),
        (".capture_sizes=[1,1e300]", ["'capture_sizes'", "1e+300"]),
        (".compile_sizes=[" + "9" * 5000 + "]", ["'compile_sizes'", "a list of positive"]),
        (".graph_warmups=1e999", ["'graph_warmups'", "inf"]),
        (".graph_warmups=true", ["'graph_warmups'", "True", "not a boolean"]),
        (".level=" + "9" * 5000, ["'level'", "digit string"]),
        ("9" * 5000, ["-O '9999", "a level (0-3"]),
        (".capture_sizes=" + "[" * 100_000, ["'capture_sizes'", "a list of positive"]),
        (".inductor_config.=1", ["'inductor_config'", "''", "option names"]),
        (".inductor_config.x=NaN", ["'inductor_config.x'", "nan", "finite"]),
        (".inductor_config.x=-Infinity", ["'inductor_config.x'", "-inf", "finite"]),
    ],
)
def test_cli_rejects_huge_and_non_finite_numbers(flag: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig.from_cli([flag])
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"graph_warmups": NaN}', "'graph_warmups'"),
        ('{"max_capture_size": Infinity}', "'max_capture_size'"),
        ('{"inductor_config": {"x": -Infinity}}', "'inductor_config.x'"),
        ('{"capture_sizes": [1e400]}', "'capture_sizes'"),
        ('{"inductor_config": {"x": 1e400}}', "'inductor_config.x'"),
        ('{"level": ' + "9" * 5000 + "}", "not valid JSON"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_json_rejects_non_finite_huge_and_deep_values(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        CompilationConfig.from_json(text)


def test_unknown_key_suggests_and_lists_keys() -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig.from_dict({"capture_size": [1]})
    message = str(info.value)
    assert "'capture_size'" in message
    assert "did you mean 'capture_sizes'?" in message
    assert "accepted keys: level, backend, splitting_ops" in message
    assert "debug_checks" in message


def test_unknown_key_without_near_match() -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig.from_json('{"zzz": 1}')
    assert "did you mean" not in str(info.value)
    assert "accepted keys:" in str(info.value)


@pytest.mark.parametrize("text", ['{"level": 3,}', "[1, 2]", ""])
def test_bad_json(text: str) -> None:
    with pytest.raises(ConfigError, match="compilation config JSON"):
        CompilationConfig.from_json(text)


def test_bad_json_quotes_the_json_error() -> None:
    with pytest.raises(ConfigError, match=r"not valid JSON \(Expecting property name"):
        CompilationConfig.from_json('{"level": 3,}')


@pytest.mark.parametrize("content", [b"\xff\xfe{}", None])
def test_unreadable_file_is_a_config_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "c.json"
    if content is not None:
        path.write_bytes(content)
    name = str(path) if content is not None else f"{tmp_path}/a\x00b.json"
    with pytest.raises(ConfigError, match="cannot read compilation config file"):
        CompilationConfig.from_file(name)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="does not exist") as info:
        CompilationConfig.from_file(missing)
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("kind", ["device", "fifo", "folder"])
def test_only_a_regular_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # /dev/zero never ends and a FIFO without a writer blocks the read forever.
    if kind == "device":
        path = "/dev/zero"
    elif kind == "fifo":
        path = str(tmp_path / "config.fifo")
        os.mkfifo(path)
    else:
        path = str(tmp_path)
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", path)
    accepted = "is not a regular file" if kind != "folder" else "Is a directory|not a regular"
    with pytest.raises(ConfigError, match=rf"SLOTWISE_COMPILATION_CONFIG: .*({accepted})"):
        CompilationConfig.from_env()


def test_a_config_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    padded = '{"level": 3}'
    path.write_text(padded + " " * (MAX_CONFIG_FILE_BYTES - len(padded)))
    assert CompilationConfig.from_file(path).level == CompilationLevel.PIECEWISE  # at the limit
    path.write_text(padded + " " * (MAX_CONFIG_FILE_BYTES + 1 - len(padded)))
    with pytest.raises(ConfigError, match=rf"larger than {MAX_CONFIG_FILE_BYTES} bytes"):
        CompilationConfig.from_file(path)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"level": 9}')
    with pytest.raises(ConfigError) as info:
        CompilationConfig.from_file(path)
    assert str(path) in str(info.value) and "'level'" in str(info.value)


def test_env_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", '{"graph_mode": "sometimes"}')
    with pytest.raises(ConfigError, match=r"SLOTWISE_COMPILATION_CONFIG: .*'graph_mode'"):
        CompilationConfig.from_env()
    monkeypatch.setenv("SLOTWISE_COMPILATION_CONFIG", "/no/such/file.json")
    with pytest.raises(ConfigError, match=r"SLOTWISE_COMPILATION_CONFIG: .*does not exist"):
        CompilationConfig.from_env()


def test_coerce_rejects_other_types() -> None:
    with pytest.raises(ConfigError, match="accepted: None, a CompilationConfig"):
        CompilationConfig.coerce(3.0)


# -- hashing ----------------------------------------------------------------------------


def test_hash_equal_for_equal_configs() -> None:
    a = CompilationConfig(splitting_ops=None, custom_ops=["+a", "-b"], compile_sizes=[2, 1])
    b = CompilationConfig.from_json(
        '{"splitting_ops": ["slotwise::unified_attention_with_output"],'
        ' "custom_ops": ["-b", "+a"], "compile_sizes": [1, 2, 2]}'
    )
    assert a.compute_hash() == b.compute_hash()
    assert len(a.compute_hash()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"level": 2},
        {"backend": "eager"},
        {"splitting_ops": []},
        {"custom_ops": ["all"]},
        {"compile_sizes": [4]},
        {"use_inductor_graph_partition": True},
        {"inductor_config": {"max_autotune": True}},
        {"graph_mode": "FULL"},
    ],
)
def test_hash_changes_with_compiled_code(change: dict[str, object]) -> None:
    assert CompilationConfig(**change).compute_hash() != CompilationConfig().compute_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"cache_dir": "/tmp/elsewhere"},
        {"debug_checks": True},
        {"graph_copy_inputs": True},
        {"disable_cache": True},
        {"graph_warmups": 5},
        {"capture_sizes": [1, 2]},
        {"max_capture_size": 64},
    ],
)
def test_hash_ignores_runtime_settings(change: dict[str, object]) -> None:
    assert CompilationConfig(**change).compute_hash() == CompilationConfig().compute_hash()


def test_hash_ignores_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = CompilationConfig().compute_hash()
    monkeypatch.setenv("SLOTWISE_CACHE_ROOT", "/x")
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "1")
    assert CompilationConfig().compute_hash() == before


def test_hash_stable_across_processes() -> None:
    code = (
        "from slotwise.compilation.config import CompilationConfig as C;"
        "print(C(inductor_config={'b': 1, 'a': [1, 2]}, custom_ops=['+x'],"
        " compile_sizes=[4, 2]).compute_hash())"
    )
    first, second = _python(code), _python(code)
    assert first == second
    local = CompilationConfig(inductor_config={"a": [1, 2], "b": 1}, custom_ops=["+x"])
    assert first == local.replace(compile_sizes=[2, 4]).compute_hash()


def test_import_does_not_load_torch() -> None:
    code = "import sys, slotwise.compilation.config; print('torch' in sys.modules)"
    assert _python(code) == "False"


def test_cli_flags_are_laid_over_the_environment_key_by_key(tmp_path):
    path = tmp_path / "compile.json"
    path.write_text('{"level": 2, "backend": "eager", "compile_sizes": [4]}')
    for value in (str(path), path.read_text()):
        environ = {"SLOTWISE_COMPILATION_CONFIG": value}
        cfg = CompilationConfig.from_env_and_cli([".compile_sizes=[8]"], environ)
        assert (cfg.level, cfg.backend, cfg.compile_sizes) == (2, "eager", [8])
    with pytest.raises(ConfigError, match="SLOTWISE_COMPILATION_CONFIG: .*'level'"):
        CompilationConfig.from_env_and_cli(["3"], {"SLOTWISE_COMPILATION_CONFIG": '{"level": 9}'})
