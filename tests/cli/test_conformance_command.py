"""`slotwise conformance NAME` when the suite cannot run: the advice it gives."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "conformance"))

from conformance_runs import run_cli

HIDDEN_CHIP_PLUGIN = """
    from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

    class HiddenChipPlatform(Platform):
        name = "hiddenchip"
        device_type = "cpu"
        device_control_env_var = "HIDDENCHIP_VISIBLE_DEVICES"

    def probe():
        return "no HiddenChip device is visible"

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("hiddenchip", __name__ + ":HiddenChipPlatform", probe)]
"""


def test_an_unavailable_platform_gets_the_probe_reason_and_the_device_variable(dists):
    dists.add("slotwise-hiddenchip", HIDDEN_CHIP_PLUGIN)
    summary, result = run_cli("hiddenchip", site=dists.root)
    assert result.returncode == 2, result.stderr[-3000:]
    error = summary["error"]
    assert "no HiddenChip device is visible" in error
    assert "HIDDENCHIP_VISIBLE_DEVICES" in error
    # conformance set SLOTWISE_PLATFORM itself: unsetting it is no advice here.
    assert "Unset SLOTWISE_PLATFORM" not in error
    assert "unset" not in error.lower()


def test_an_unknown_platform_keeps_resolutions_message(dists):
    summary, result = run_cli("nosuchchip", site=dists.root)
    assert result.returncode == 2
    assert "no such platform" in summary["error"]
