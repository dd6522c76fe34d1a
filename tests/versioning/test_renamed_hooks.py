"""A hook renamed in a minor version: plugins using the old name still load, with one warning.

No hook has been renamed in API 1.0, so the child process puts a rename into the table
before any plugin loads, as a future 1.1 would ship it: ``slotwise_list_platforms`` as
the old name of ``slotwise_platforms``.
"""

from __future__ import annotations

import json

RENAME = """
import slotwise
from slotwise import api_versioning
slotwise.API_VERSION = "1.1"
api_versioning.RENAMED_HOOKS["slotwise_list_platforms"] = ("slotwise_platforms", "1.1")
"""

RESOLVE_AND_REPORT = """
import json
from slotwise.platforms import plugin_report
print(slotwise.current_platform.name)
print(json.dumps({r.name: [r.status, r.reason] for r in plugin_report()}))
"""


def legacy_plugin(*, also_new_name: bool = False) -> str:
    """A plugin offering platform "legacy" through the hook's old name (and maybe the new)."""
    new_hook = """
        @hookimpl
        def slotwise_platforms():
            return [PlatformSpec("legacy", __name__ + ":LegacyPlatform", lambda: True,
                                 priority=200)]
    """
    return f"""
        from slotwise.platforms import Platform, PlatformSpec
        from slotwise.plugins import hookimpl

        class LegacyPlatform(Platform):
            name = "legacy"
            device_type = "cpu"

        @hookimpl
        def slotwise_list_platforms():
            return [PlatformSpec("legacy", __name__ + ":LegacyPlatform", lambda: True,
                                 priority=200)]
        {new_hook if also_new_name else ""}
    """


def deprecation_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "slotwise_list_platforms" in line]


def test_old_hook_name_still_provides_the_platform_and_warns_once(dists):
    dists.add("slotwise-legacy", legacy_plugin(), version="0.7")
    for strict in ("0", "1"):  # a deprecation is not a broken plugin, even in strict mode
        result = dists.run(RENAME + RESOLVE_AND_REPORT, SLOTWISE_STRICT_PLUGINS=strict)
        assert result.returncode == 0, result.stderr
        name, report = result.stdout.splitlines()
        assert name == "legacy"
        assert json.loads(report)["legacy"][0] == "selected"
        [warning] = deprecation_lines(result.stderr)
        assert "slotwise-legacy 0.7" in warning
        assert "slotwise_platforms" in warning and "1.1" in warning and "2.0" in warning


def test_without_the_rename_the_old_name_is_an_unknown_hook(dists):
    dists.add("slotwise-legacy", legacy_plugin())
    result = dists.run("import slotwise\n" + RESOLVE_AND_REPORT)
    name, report = result.stdout.splitlines()
    assert name == "cpu", result.stderr
    assert json.loads(report)["slotwise_legacy"][0] == "failed"
    assert "unknown hooks slotwise_list_platforms" in result.stderr


def test_plugin_with_old_and_new_name_registers_once_through_the_new_one(dists):
    dists.add("slotwise-legacy", legacy_plugin(also_new_name=True))
    result = dists.run(RENAME + RESOLVE_AND_REPORT)
    assert result.returncode == 0, result.stderr
    name, report = result.stdout.splitlines()
    assert name == "legacy"
    assert json.loads(report)["legacy"][0] == "selected"  # not "registers already"
    [warning] = deprecation_lines(result.stderr)
    assert "slotwise-legacy" in warning and "slotwise_list_platforms is ignored" in warning
