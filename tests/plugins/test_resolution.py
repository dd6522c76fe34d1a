"""Platform resolution through real entry points, each case in a fresh process."""

from __future__ import annotations

import json

import pytest

from slotwise.version import API_VERSION

RESOLVE = """
import slotwise
print(slotwise.current_platform.name)
"""

REPORT = """
import json
from slotwise.platforms import plugin_report
print(json.dumps({r.name: [r.status, r.reason] for r in plugin_report()}))
"""


def vendor_plugin(
    platform: str,
    *,
    priority: int = 200,
    available: bool | str = True,
    requires_api: str = ">=1.0,<2",
    probe_log: str = "",
) -> str:
    """Source of a plugin module offering one CPU-backed platform."""
    return f"""
        import os
        from slotwise.platforms import Platform, PlatformSpec
        from slotwise.plugins import hookimpl

        class VendorPlatform(Platform):
            name = {platform!r}
            device_type = "cpu"

        def probe():
            if {probe_log!r}:
                with open({probe_log!r}, "a") as log:
                    log.write("probe\\n")
            return {available!r}

        @hookimpl
        def slotwise_platforms():
            return [PlatformSpec({platform!r}, __name__ + ":VendorPlatform", probe,
                                 priority={priority}, requires_api={requires_api!r})]
    """


def test_vendor_plugin_of_higher_priority_wins_and_env_override_selects_cpu(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor"))
    assert dists.run(RESOLVE).stdout.strip() == "vendor"
    assert dists.run(RESOLVE, SLOTWISE_PLATFORM="cpu").stdout.strip() == "cpu"


def test_selected_platform_is_an_instance_of_the_plugins_class(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor"))
    result = dists.run(
        """
        from slotwise.platforms import get_current_platform
        import slotwise_vendor
        print(type(get_current_platform()) is slotwise_vendor.VendorPlatform)
        """
    )
    assert result.stdout.strip() == "True", result.stderr


def test_tie_at_the_top_names_both_plugins_and_the_fix(dists):
    dists.add("slotwise-alpha", vendor_plugin("alpha", priority=300))
    dists.add("slotwise-beta", vendor_plugin("beta", priority=300))
    result = dists.run(RESOLVE)
    assert result.returncode != 0
    assert "PlatformError" in result.stderr
    assert "slotwise-alpha" in result.stderr and "slotwise-beta" in result.stderr
    assert "SLOTWISE_PLATFORM" in result.stderr
    assert dists.run(RESOLVE, SLOTWISE_PLATFORM="beta").stdout.strip() == "beta"


def test_unavailable_higher_priority_platform_is_passed_over(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor", available="no vendor card"))
    assert dists.run(RESOLVE).stdout.strip() == "cpu"
    report = json.loads(dists.run(REPORT).stdout)
    assert report["vendor"] == ["unavailable", "no vendor card"]


BROKEN_PLUGINS = {
    "import": "raise ImportError('vendor SDK missing')",
    "hook": """
        from slotwise.plugins import hookimpl
        @hookimpl
        def slotwise_platforms():
            raise RuntimeError('hook exploded')
    """,
    "garbage": """
        from slotwise.plugins import hookimpl
        @hookimpl
        def slotwise_platforms():
            return ['not a spec']
    """,
    "typo": """
        from slotwise.plugins import hookimpl
        @hookimpl
        def slotwise_platform():
            return []
    """,
}
BROKEN_MESSAGES = {
    "import": "vendor SDK missing",
    "hook": "hook exploded",
    "garbage": "expected PlatformSpec",
    "typo": "did you mean slotwise_platforms",
}


@pytest.mark.parametrize("kind", sorted(BROKEN_PLUGINS))
def test_broken_plugin_warns_once_and_others_still_resolve(dists, kind):
    dists.add("slotwise-broken", BROKEN_PLUGINS[kind], version="0.3")
    dists.add("slotwise-vendor", vendor_plugin("vendor"))
    result = dists.run(RESOLVE + REPORT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "vendor"
    warnings = [line for line in result.stderr.splitlines() if "slotwise-broken" in line]
    assert len(warnings) == 1, result.stderr
    assert "0.3" in warnings[0] and BROKEN_MESSAGES[kind] in warnings[0]
    report = json.loads(result.stdout.splitlines()[1])
    assert report["slotwise_broken"][0] == "failed"


@pytest.mark.parametrize("kind", sorted(BROKEN_PLUGINS))
def test_strict_mode_turns_a_broken_plugin_into_an_error(dists, kind):
    dists.add("slotwise-broken", BROKEN_PLUGINS[kind])
    result = dists.run(RESOLVE, SLOTWISE_STRICT_PLUGINS="1")
    assert result.returncode != 0
    assert "PluginError" in result.stderr
    assert "slotwise-broken" in result.stderr and BROKEN_MESSAGES[kind] in result.stderr


def test_probe_that_raises_fails_its_plugin_not_the_process(dists):
    source = vendor_plugin("vendor").replace("return True", "raise OSError('bus error')")
    dists.add("slotwise-vendor", source)
    result = dists.run(RESOLVE)
    assert result.stdout.strip() == "cpu", result.stderr
    assert "bus error" in result.stderr and "slotwise-vendor" in result.stderr


def test_incompatible_api_range_is_reported_never_selected_and_errors_when_forced(dists):
    dists.add("slotwise-future", vendor_plugin("future", priority=500, requires_api=">=2,<3"))
    result = dists.run(RESOLVE + REPORT)
    lines = result.stdout.splitlines()
    assert lines[0] == "cpu", result.stderr
    status, reason = json.loads(lines[1])["future"]
    assert status == "incompatible"
    assert ">=2,<3" in reason and f"API {API_VERSION}" in reason
    forced = dists.run(RESOLVE, SLOTWISE_PLATFORM="future")
    assert forced.returncode != 0
    assert "PlatformError" in forced.stderr and ">=2,<3" in forced.stderr


def test_unknown_platform_name_lists_the_known_ones(dists):
    result = dists.run(RESOLVE, SLOTWISE_PLATFORM="nope")
    assert result.returncode != 0
    assert "PlatformNotFoundError" in result.stderr
    assert "nope" in result.stderr
    for known in ("cpu", "cuda", "ascend_stub"):
        assert known in result.stderr


def test_forcing_an_unavailable_platform_gives_its_probe_reason(dists):
    result = dists.run(RESOLVE, SLOTWISE_PLATFORM="ascend_stub")
    assert result.returncode != 0
    assert "SLOTWISE_ASCEND_STUB_DEVICES is not set" in result.stderr


def test_allow_list_filters_plugins_by_entry_point_name(dists):
    dists.add("slotwise-vendor", vendor_plugin("vendor"), entry_point="vendor")
    result = dists.run(RESOLVE + REPORT, SLOTWISE_PLUGINS="cpu")
    lines = result.stdout.splitlines()
    assert lines[0] == "cpu", result.stderr
    report = json.loads(lines[1])
    assert report["vendor"][0] == "filtered"
    assert "cuda" in report and report["cuda"][0] == "filtered"
    allowed = dists.run(RESOLVE, SLOTWISE_PLUGINS="vendor,cpu")
    assert allowed.stdout.strip() == "vendor"


def test_allow_list_naming_a_missing_plugin_warns(dists):
    result = dists.run(RESOLVE, SLOTWISE_PLUGINS="cpu,missing")
    assert result.stdout.strip() == "cpu"
    assert "missing" in result.stderr and "no such plugin" in result.stderr


def test_sixteen_threads_race_probe_once_and_share_one_object(dists, tmp_path):
    log = tmp_path / "probes.log"
    dists.add("slotwise-vendor", vendor_plugin("vendor", probe_log=str(log)))
    result = dists.run(
        """
        import threading
        import slotwise
        from slotwise.platforms import get_current_platform
        barrier = threading.Barrier(16)
        seen = []
        def worker():
            barrier.wait()
            seen.append((slotwise.current_platform.name, id(get_current_platform())))
        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(len(seen), len(set(seen)), seen[0][0])
        """
    )
    assert result.stdout.split() == ["16", "1", "vendor"], result.stderr
    assert log.read_text().splitlines() == ["probe"]


def test_resolving_cpu_does_not_import_torch(dists):
    result = dists.run(
        """
        import sys
        import slotwise
        assert slotwise.current_platform.name == "cpu"
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    assert result.stdout.strip() == "[]", result.stderr


def test_resolution_error_is_raised_again_on_every_use(dists):
    result = dists.run(
        """
        import slotwise
        for _ in range(2):
            try:
                slotwise.current_platform.name
            except Exception as exc:
                print(type(exc).__name__)
        """,
        SLOTWISE_PLATFORM="nope",
    )
    assert result.stdout.split() == ["PlatformNotFoundError", "PlatformNotFoundError"]
