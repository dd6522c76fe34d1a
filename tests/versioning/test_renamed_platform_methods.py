"""A platform method renamed in a minor version keeps working under its old name, with a warning.

No method has been renamed in API 1.0, so each test puts a rename into the table as a
future minor version would: ``get_graphs`` as the old name of ``get_graph_api``.
"""

from __future__ import annotations

import warnings

import pytest

from slotwise import api_versioning
from slotwise.platforms import Platform

OLD, NEW = "get_graphs", "get_graph_api"


class GraphApi:
    """Stands in for a platform's GraphAPI."""


GRAPH_API = GraphApi()


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

            def get_graphs(self, **kwargs):
                return GRAPH_API

    assert LegacyPlatform().get_graph_api() is GRAPH_API
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

            def get_graphs(self, **kwargs):
                return None

            def get_graph_api(self, **kwargs):
                return GRAPH_API

    assert UpdatedPlatform().get_graph_api() is GRAPH_API
    [warning] = deprecations(record)
    assert f"{OLD}() is ignored" in str(warning.message)


def test_inheriting_a_renamed_method_does_not_warn_again(renamed):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")

        class LegacyPlatform(Platform):
            name = "legacy"
            device_type = "cpu"

            def get_graphs(self, **kwargs):
                return GRAPH_API

        class LegacyChild(LegacyPlatform):
            name = "child"

    assert len(deprecations(record)) == 1
    assert LegacyChild().get_graph_api() is GRAPH_API


def test_platform_without_old_names_defines_quietly(renamed):
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class ModernPlatform(Platform):
            name = "modern"
            device_type = "cpu"

    assert ModernPlatform().get_graph_api() is None
