"""Plugins that load with problems fail the ``loading`` check, and only it.

slotwise keeps running when a plugin's hook raises (it skips the plugin with a warning),
but a vendor's conformance run must not pass: each plugin here is a throwaway
distribution whose platform is the CPU's under another name, sound except for one
loading problem.
"""

from __future__ import annotations

import pytest
from conformance_runs import messages, outcomes, run_cli

pytestmark = pytest.mark.slow

#: The CPU platform as "typo_ops", with its CPU attention backend; ``REGISTER_OPS`` is
#: replaced by each test's custom-op hook body.
PLUGIN = """
    from slotwise.plugin_api import PlatformSpec, hookimpl
    from slotwise_cpu.platform import CpuPlatform

    class TypoOpsPlatform(CpuPlatform):
        name = "typo_ops"

    def rms_norm(layer, x, residual=None):
        return layer.forward_native(x, residual)

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("typo_ops", "slotwise_typo_ops:TypoOpsPlatform", lambda: True,
                             priority=300, requires_api=">=1.1,<2")]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        registry.register_own("slotwise_cpu.attention:CpuSdpaBackend")

    @hookimpl
    def slotwise_register_custom_ops(registry):
        REGISTER_OPS
"""


def failing_checks(summary) -> set[str]:
    return {check for check, outcome in outcomes(summary).items() if outcome in ("failed", "error")}


def run_plugin(dists, register_ops: str, *, strict: bool = False):
    dists.add("slotwise-typo-ops", PLUGIN.replace("REGISTER_OPS", register_ops))
    env = {"SLOTWISE_STRICT_PLUGINS": "1"} if strict else {}
    summary, result = run_cli("typo_ops", site=dists.root, **env)
    assert result.returncode == 1, result.stderr[-5000:]
    assert failing_checks(summary) == {"loading"}, summary
    return messages(summary, "loading")


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_registration_hook_that_raises_fails_loading_with_its_message(dists, strict):
    problem = run_plugin(
        dists,
        'registry.register_own("rms_norm", rms_norm)\n'
        '        registry.register_own("rms_nrom", rms_norm)',
        strict=strict,
    )
    assert problem.startswith("platform 'typo_ops': plugin 'slotwise_typo_ops'"), problem
    assert "hook slotwise_register_custom_ops raised CustomOpError" in problem
    assert "unknown custom op 'rms_nrom'" in problem


def test_a_registration_for_a_misspelt_platform_fails_loading(dists):
    problem = run_plugin(dists, 'registry.register("typo_opz", "rms_norm", rms_norm)')
    assert "a replacement for custom op 'rms_norm' for platform 'typo_opz'" in problem
    assert "which no installed plugin declares" in problem
    assert "did you mean 'typo_ops'?" in problem


def test_a_hook_without_hookimpl_fails_loading(dists):
    problem = run_plugin(
        dists,
        'registry.register_own("rms_norm", rms_norm)\n\n'
        "    def slotwise_register_custom_op(registry):\n"
        '        registry.register_own("silu_and_mul", rms_norm)',
    )
    assert "defines slotwise_register_custom_op(), which looks like hook" in problem
    assert "did you forget @hookimpl?" in problem
