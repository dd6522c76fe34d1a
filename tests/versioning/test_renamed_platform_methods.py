"""A platform method renamed in a minor version keeps working under its old name, with a warning.

No method has been renamed in API 1.0, so each test puts a rename into the table as a
future minor version would: ``get_graph_wrapper_cls`` as the old name of
``get_static_graph_wrapper_cls``.
"""

from __future__ import annotations

import warnings

import pytest

from slotwise import api_versioning
from slotwise.platforms import Platform

OLD, NEW = "get_graph_wrapper_cls", "get_static_graph_wrapper_cls"


class Wrapper:
    """Stands in for a static-graph wrapper class."""


@pytest.fixture
def renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(api_versioning.RENAMED_PLATFORM_METHODS, OLD, (NEW, "1.1"))


def deprecations(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, DeprecationWarning)]


def test_method_under_the_old_name_answers_to_the_new_one_and_warns_once(renamed):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")

        class LegacyPlatform(Platform):
            name = "legacy"
            device_type = "cpu"

            def get_graph_wrapper_cls(self, **kwargs):
                return Wrapper

    assert LegacyPlatform().get_static_graph_wrapper_cls() is Wrapper
    [warning] = deprecations(record)
    message = str(warning.message)
    assert "LegacyPlatform" in message and OLD in message and NEW in message
    assert "1.1" in message and "2.0" in message
    # The warning points at the class statement, where the plugin author must act.
    assert warning.filename == __file__


def test_subclass_defining_both_names_keeps_the_new_one(renamed):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")

        class UpdatedPlatform(Platform):
            name = "updated"
            device_type = "cpu"

            def get_graph_wrapper_cls(self, **kwargs):
                return None

            def get_static_graph_wrapper_cls(self, **kwargs):
                return Wrapper

    assert UpdatedPlatform().get_static_graph_wrapper_cls() is Wrapper
    [warning] = deprecations(record)
    assert f"{OLD}() is ignored" in str(warning.message)


def test_inheriting_a_renamed_method_does_not_warn_again(renamed):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")

        class LegacyPlatform(Platform):
            name = "legacy"
            device_type = "cpu"

            def get_graph_wrapper_cls(self, **kwargs):
                return Wrapper

        class LegacyChild(LegacyPlatform):
            name = "child"

    assert len(deprecations(record)) == 1
    assert LegacyChild().get_static_graph_wrapper_cls() is Wrapper


def test_platform_without_old_names_defines_quietly(renamed):
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class ModernPlatform(Platform):
            name = "modern"
            device_type = "cpu"

    assert ModernPlatform().get_static_graph_wrapper_cls() is None
