"""A plugin written against API 1.0 keeps working through minor bumps and stops at the major one.

Each case runs in a fresh process that sets ``slotwise.API_VERSION`` before platform
resolution, as a later slotwise release would ship it.
"""

from __future__ import annotations

import json

import pytest

from slotwise import api_versioning

PLUGIN_FOR_1_0 = """
    from slotwise.platforms import Platform, PlatformSpec
    from slotwise.plugins import hookimpl

    class VendorPlatform(Platform):
        name = "vendor"
        device_type = "cpu"

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("vendor", __name__ + ":VendorPlatform", lambda: True,
                             priority=200, requires_api=">=1.0,<2")]
"""

REPORT_AT = """
import json
import slotwise.version
slotwise.version.API_VERSION = {version!r}
from slotwise.platforms import plugin_report
print(json.dumps({{r.name: [r.status, r.reason] for r in plugin_report()}}))
"""


def report_at(dists, version: str) -> dict[str, list[str]]:
    """Status and reason of each platform when slotwise provides API ``version``."""
    result = dists.run(REPORT_AT.format(version=version))
    assert result.returncode == 0, result.stderr
    assert "slotwise-vendor" not in result.stderr  # loaded without any warning
    return json.loads(result.stdout)


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.9"])
def test_plugin_for_1_0_loads_and_is_selected_after_minor_bumps(dists, version):
    dists.add("slotwise-vendor", PLUGIN_FOR_1_0)
    assert report_at(dists, version)["vendor"][0] == "selected"


def test_plugin_for_1_0_is_reported_incompatible_at_2_0(dists):
    dists.add("slotwise-vendor", PLUGIN_FOR_1_0)
    status, reason = report_at(dists, "2.0")["vendor"]
    assert status == "incompatible"
    assert "requires slotwise API >=1.0,<2" in reason and "provides API 2.0" in reason


def test_removal_version_is_the_next_major():
    assert api_versioning.removal_version("1.1") == "2.0"
    assert api_versioning.removal_version("2.13") == "3.0"
