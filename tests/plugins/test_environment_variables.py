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


def test_validate_all_checks_the_probe_timeout(monkeypatch):
    monkeypatch.setenv("SLOTWISE_PROBE_TIMEOUT", "0")
    with pytest.raises(EnvironmentVariableError, match="SLOTWISE_PROBE_TIMEOUT='0'"):
        envs.validate_all()
