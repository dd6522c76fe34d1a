"""Conformance checks on what plugins declare: the API range, unmarked hooks, priorities."""

from __future__ import annotations

import json

import pytest
from test_resolution import RESOLVE, vendor_plugin

from slotwise.platforms import PlatformSpec
from slotwise.platforms.spec import api_range_warning


def spec(**overrides: object) -> PlatformSpec:
    fields: dict[str, object] = {
        "name": "vendor",
        "platform_cls": "slotwise_vendor.platform:VendorPlatform",
        "probe": lambda: True,
    }
    fields.update(overrides)
    return PlatformSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("requires_api", ["", "   "])
def test_empty_requires_api_is_rejected_naming_the_field_and_an_example(requires_api):
    with pytest.raises(ValueError) as caught:
        spec(requires_api=requires_api)
    assert "requires_api" in str(caught.value)
    assert ">=1.0,<2" in str(caught.value)


@pytest.mark.parametrize("requires_api", [">=1.0,<2", "~=1.0", "==1.*", ">=1.0,<=1.9"])
def test_bounded_requires_api_has_no_warning(requires_api):
    assert api_range_warning(spec(requires_api=requires_api)) == ""


@pytest.mark.parametrize("requires_api", [">=1.0", ">1.0", ">=1.0,!=1.2"])
def test_open_ended_requires_api_has_a_warning_with_the_fix(requires_api):
    warning = api_range_warning(spec(requires_api=requires_api))
    assert "major" in warning and "<2" in warning and requires_api in warning


def test_open_ended_requires_api_warns_once_naming_the_plugin(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor", requires_api=">=1.0"), version="0.7")
    result = dists.run(
        """
        import slotwise
        from slotwise.platforms import plugin_report
        print(slotwise.current_platform.name)
        plugin_report()
        print(slotwise.current_platform.name)
        """
    )
    assert result.stdout.split() == ["vendor", "vendor"], result.stderr
    warnings = [line for line in result.stderr.splitlines() if "major" in line]
    assert len(warnings) == 1, result.stderr
    assert "slotwise-vendor 0.7" in warnings[0]
    assert "'>=1.0'" in warnings[0] and "<2" in warnings[0]


def test_empty_requires_api_in_a_plugin_fails_that_plugin_only(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor", requires_api=""))
    result = dists.run(RESOLVE)
    assert result.stdout.strip() == "cpu", result.stderr
    assert "slotwise-vendor" in result.stderr and "requires_api" in result.stderr


UNMARKED = """
    from slotwise.platforms import PlatformSpec

    def {name}():
        return [PlatformSpec("vendor", __name__ + ":Nothing", lambda: True, priority=300)]

    def helper():
        return 1
"""


@pytest.mark.parametrize(
    ("name", "hook"),
    [("slotwise_platforms", "slotwise_platforms"), ("slotwise_platform", "slotwise_platforms")],
)
def test_hook_named_function_without_hookimpl_warns(dists, name, hook):
    dists.add("slotwise-vendor", UNMARKED.format(name=name), version="0.3")
    result = dists.run(RESOLVE)
    assert result.stdout.strip() == "cpu", result.stderr
    warnings = [line for line in result.stderr.splitlines() if "@hookimpl" in line]
    assert len(warnings) == 1, result.stderr
    warning = warnings[0]
    assert "did you forget @hookimpl?" in warning
    assert f"{name}()" in warning and "slotwise-vendor 0.3" in warning
    assert "from slotwise.plugin_api import hookimpl" in warning
    assert hook in warning
    assert "helper" not in result.stderr


def test_marked_hooks_and_functions_imported_from_elsewhere_do_not_warn(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor"))
    dists.add("slotwise-other", "from json import dumps as slotwise_platform\n")
    result = dists.run(RESOLVE)
    assert result.stdout.strip() == "vendor", result.stderr
    assert "@hookimpl" not in result.stderr


def test_bundled_plugins_leave_room_for_vendors():
    from slotwise_ascend_stub.plugin import slotwise_platforms

    (stub,) = slotwise_platforms()
    assert 100 < stub.priority < 200


def test_vendor_at_documented_priority_beats_the_stub_without_a_tie(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor", priority=200))
    result = dists.run(RESOLVE, SLOTWISE_ASCEND_STUB_DEVICES="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "vendor"
    without_vendor = dists.run(
        RESOLVE, SLOTWISE_ASCEND_STUB_DEVICES="1", SLOTWISE_PLUGINS="ascend_stub,cpu"
    )
    assert without_vendor.stdout.strip() == "ascend_stub", without_vendor.stderr


def test_bounded_requires_api_in_a_plugin_does_not_warn(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor"))
    report = dists.run(
        "import json; from slotwise.platforms import plugin_report;"
        "print(json.dumps({r.name: r.status for r in plugin_report()}))"
    )
    assert json.loads(report.stdout)["vendor"] == "selected", report.stderr
    assert "major" not in report.stderr
