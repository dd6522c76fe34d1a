"""Registration hooks know the plugin's own platform, and a registration for a platform
that no installed plugin declares is warned about, naming the closest declared one."""

from __future__ import annotations

import json

import pytest

#: A plugin declaring ``PLATFORMS`` (CPU platforms by other names) whose hooks run ``BODY``.
PLUGIN = """
    from slotwise.plugin_api import PlatformSpec, hookimpl
    from slotwise_cpu.platform import CpuPlatform

    def rms_norm(layer, x, residual=None):
        return layer.forward_native(x, residual)

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec(name, "slotwise_cpu.platform:CpuPlatform", lambda: "not here",
                             priority=200, requires_api=">=1.1,<2") for name in PLATFORMS]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        ATTENTION

    @hookimpl
    def slotwise_register_custom_ops(registry):
        OPS
"""

REPORT = """
import json
from slotwise.attention.registry import get_attention_backend_registry
from slotwise.custom_op import get_custom_op_registry
from slotwise.plugins import get_plugin_manager

attention = get_attention_backend_registry().registrations()
ops = get_custom_op_registry().registrations()
record = get_plugin_manager().records["slotwise_vendor"]
print(json.dumps({"attention": attention, "ops": ops, "status": record.status,
                  "reason": record.reason, "warnings": record.warnings}))
"""


def run_plugin(dists, platforms, attention="pass", ops="pass", **env):
    source = (
        PLUGIN.replace("PLATFORMS", repr(platforms))
        .replace("ATTENTION", attention)
        .replace("OPS", ops)
    )
    dists.add("slotwise-vendor", source)
    result = dists.run(REPORT, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_register_own_registers_for_the_one_platform_the_plugin_declares(dists):
    report, stderr = run_plugin(
        dists,
        ["acme"],
        attention='registry.register_own("slotwise_cpu.attention:CpuSdpaBackend", priority=5)',
        ops='registry.register_own("rms_norm", rms_norm)',
    )
    assert ["acme", "attention backend slotwise_cpu.attention:CpuSdpaBackend"] in (
        report["attention"]
    )
    assert ["acme", "a replacement for custom op 'rms_norm'"] in report["ops"]
    assert report["status"] == "loaded" and report["warnings"] == [], stderr


@pytest.mark.parametrize(
    "platforms, declares",
    [([], "declares no platform"), (["acme", "acme_two"], "declares platforms acme, acme_two")],
)
def test_register_own_without_exactly_one_own_platform_fails_the_plugin(dists, platforms, declares):
    report, stderr = run_plugin(dists, platforms, ops='registry.register_own("rms_norm", rms_norm)')
    assert report["status"] == "failed"
    assert "hook slotwise_register_custom_ops raised CustomOpError" in report["reason"]
    assert (
        f"registers for the plugin's own platform, but this plugin {declares}" in (report["reason"])
    )
    assert "registry.register(<platform name>, ...)" in report["reason"]
    assert report["reason"] in stderr


def test_a_registration_for_an_undeclared_platform_is_warned_about_and_kept(dists):
    report, stderr = run_plugin(
        dists,
        ["acme"],
        attention='registry.register("acmee", "slotwise_cpu.attention:CpuSdpaBackend")',
        ops='registry.register("cpu", "rms_norm", rms_norm)',  # another plugin's platform
    )
    assert report["status"] == "loaded"
    (warning,) = report["warnings"]
    assert warning.startswith(
        "registers attention backend slotwise_cpu.attention:CpuSdpaBackend for platform "
        "'acmee', which no installed plugin declares, so it is never used; did you mean 'acme'?"
    )
    assert "Declared platforms: acme, ascend_stub, cpu, cuda" in warning
    assert warning in stderr and stderr.count(warning) == 1
