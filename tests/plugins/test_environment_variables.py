"""The typed accessors of slotwise.envs: junk is an error naming variable, value, fix."""

from __future__ import annotations

import pytest

from slotwise import envs
from slotwise.errors import EnvironmentVariableError, SlotwiseError


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("On", True), ("no", False)])
def test_flag_accepts_the_usual_spellings(monkeypatch, value, expected):
    monkeypatch.setenv("SLOTWISE_STRICT_PLUGINS", value)
    assert envs.flag("SLOTWISE_STRICT_PLUGINS") is expected


def test_flag_rejects_junk_with_a_slotwise_error_that_is_also_a_value_error(monkeypatch):
    monkeypatch.setenv("SLOTWISE_DISABLE_COMPILE_CACHE", "maybe")
    with pytest.raises(EnvironmentVariableError) as caught:
        envs.flag("SLOTWISE_DISABLE_COMPILE_CACHE")
    assert isinstance(caught.value, SlotwiseError) and isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        "SLOTWISE_DISABLE_COMPILE_CACHE='maybe' is not a boolean; accepted values: "
        "1, true, yes, on, 0, false, no, off. Fix or unset SLOTWISE_DISABLE_COMPILE_CACHE."
    )


def test_dist_timeout_default_value_and_bounds(monkeypatch):
    monkeypatch.delenv("SLOTWISE_DIST_TIMEOUT", raising=False)
    assert envs.dist_timeout() == 600
    monkeypatch.setenv("SLOTWISE_DIST_TIMEOUT", "604800")
    assert envs.dist_timeout() == 604800
    for junk in ("1e300", "nan", "inf", "-5", "0", "ten"):
        monkeypatch.setenv("SLOTWISE_DIST_TIMEOUT", junk)
        with pytest.raises(EnvironmentVariableError, match=r"<= 604800 \(default 600\)"):
            envs.dist_timeout()


def test_logging_level_any_case(monkeypatch):
    monkeypatch.setenv("SLOTWISE_LOGGING_LEVEL", "debug")
    assert envs.logging_level() == "DEBUG"
    monkeypatch.setenv("SLOTWISE_LOGGING_LEVEL", "LOUD")
    with pytest.raises(EnvironmentVariableError, match="DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        envs.logging_level()


@pytest.mark.parametrize("variable", ["SLOTWISE_PROBE_TIMEOUT", "SLOTWISE_PLUGIN_TIMEOUT"])
def test_validate_all_checks_the_plugin_time_limits(monkeypatch, variable):
    monkeypatch.setenv(variable, "0")
    with pytest.raises(EnvironmentVariableError, match=f"{variable}='0'"):
        envs.validate_all()


def test_plugin_timeout_default_value_and_bounds(monkeypatch):
    monkeypatch.delenv("SLOTWISE_PLUGIN_TIMEOUT", raising=False)
    assert envs.plugin_timeout() == 30
    monkeypatch.setenv("SLOTWISE_PLUGIN_TIMEOUT", "0.25")
    assert envs.plugin_timeout() == 0.25
    monkeypatch.setenv("SLOTWISE_PLUGIN_TIMEOUT", "3601")
    with pytest.raises(EnvironmentVariableError, match=r"<= 3600 \(default 30\)"):
        envs.plugin_timeout()


@pytest.mark.parametrize(("value", "expected"), [("", []), (" , ", []), ("a, b,", ["a", "b"])])
def test_a_name_list_set_but_empty_names_nothing(monkeypatch, value, expected):
    monkeypatch.setenv("SLOTWISE_PLUGINS", value)
    assert envs.name_list("SLOTWISE_PLUGINS") == expected
    monkeypatch.delenv("SLOTWISE_PLUGINS")
    assert envs.name_list("SLOTWISE_PLUGINS") is None
