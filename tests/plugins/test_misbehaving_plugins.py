"""Plugins that hang, interrupt, exit, print or change the environment, through real entry
points."""

from __future__ import annotations

import json

import pytest

RESOLVE = """
import slotwise
print(slotwise.current_platform.name)
"""

REPORT = """
import json
from slotwise.platforms import plugin_report
print(json.dumps({r.name: [r.status, r.reason] for r in plugin_report()}))
"""

ENV_JSON = """
from slotwise.cli.main import main
raise SystemExit(main(["env", "--json"]))
"""


def vendor_plugin(probe: str = "return True", *, at_import: str = "", in_hook: str = "") -> str:
    """Source of a plugin offering platform "vendor" (priority 200), with code to misbehave."""
    return f"""
        import os, sys, time
        from slotwise.platforms import Platform, PlatformSpec
        from slotwise.plugins import hookimpl

        {at_import}

        class VendorPlatform(Platform):
            name = "vendor"
            device_type = "cpu"

            def __init__(self):
                print("printed by the platform's constructor")

        def probe():
            {probe}

        @hookimpl
        def slotwise_platforms():
            {in_hook}
            return [PlatformSpec("vendor", __name__ + ":VendorPlatform", probe, priority=200)]
    """


def test_hanging_probe_fails_its_plugin_after_the_timeout(dists):
    dists.add("slotwise-vendor", vendor_plugin("time.sleep(3600)"))
    result = dists.run(RESOLVE + REPORT, SLOTWISE_PROBE_TIMEOUT="0.5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "cpu"
    status, reason = json.loads(lines[1])["vendor"]
    assert status == "failed"
    assert "timed out after 0.5 s" in reason and "SLOTWISE_PROBE_TIMEOUT" in reason
    assert "slotwise-vendor" in result.stderr and "timed out" in result.stderr


def test_explicit_platform_never_calls_the_other_probes(dists, tmp_path):
    marker = tmp_path / "probed"
    dists.add("slotwise-vendor", vendor_plugin(f"open({str(marker)!r}, 'w'); time.sleep(3600)"))
    result = dists.run(RESOLVE + REPORT, SLOTWISE_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "cpu"
    status, reason = json.loads(lines[1])["vendor"]
    assert status == "unprobed" and "SLOTWISE_PLATFORM=cpu" in reason
    env = dists.run(ENV_JSON, SLOTWISE_PLATFORM="cpu")
    assert env.returncode == 0, env.stderr
    assert json.loads(env.stdout)["platform"] == "cpu"
    assert not marker.exists()


INTERRUPT_ONCE = """
calls = []
def interrupt_once():
    calls.append(1)
    if len(calls) == 1:
        raise {exc}("stopped by the vendor SDK")
"""


@pytest.mark.parametrize("where", ["hook", "probe"])
def test_ctrl_c_propagates_is_named_and_is_not_remembered(dists, where):
    exc = "KeyboardInterrupt"
    code = {"at_import": INTERRUPT_ONCE.format(exc=exc).replace("\n", "\n        ")}
    if where == "hook":
        code["in_hook"] = "interrupt_once()"
    else:
        code["probe"] = "interrupt_once(); return True"
    dists.add("slotwise-vendor", vendor_plugin(**code))
    result = dists.run(
        """
        import os
        from slotwise.platforms import get_current_platform
        try:
            get_current_platform()
        except BaseException as exc:
            print(type(exc).__name__)
        os.environ["SLOTWISE_PLATFORM"] = "cpu"
        print(get_current_platform().name)
        """
    )
    assert result.stdout.split() == [exc, "cpu"], result.stderr
    assert "slotwise-vendor" in result.stderr and f"interrupted by {exc}" in result.stderr


@pytest.mark.parametrize("where", ["hook", "probe"])
def test_sys_exit_in_a_hook_or_probe_fails_the_plugin_not_the_process(dists, where):
    code = {"in_hook": "sys.exit(3)"} if where == "hook" else {"probe": "sys.exit(3)"}
    dists.add("slotwise-vendor", vendor_plugin(**code))
    result = dists.run(RESOLVE + REPORT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "cpu"
    status, reason = json.loads(lines[1])["slotwise_vendor" if where == "hook" else "vendor"]
    assert status == "failed"
    assert "called sys.exit(3), which would end the process" in reason
    (warning,) = [line for line in result.stderr.splitlines() if "sys.exit(3)" in line]
    assert "slotwise-vendor 1.0" in warning and ("hook slotwise_platforms" in warning) == (
        where == "hook"
    )


PRINTING = {
    "at_import": "print('printed at import')",
    "in_hook": "print('printed by the hook')",
    "probe": "print('printed by the probe'); return True",
}


def test_plugin_output_goes_to_stderr_not_stdout(dists):
    dists.add("slotwise-vendor", vendor_plugin(**PRINTING))
    result = dists.run(RESOLVE)
    assert result.stdout == "vendor\n", result.stderr
    for place in ("at import", "by the hook", "by the probe", "by the platform's constructor"):
        assert f"printed {place}" in result.stderr


def test_plugin_changing_slotwise_variables_is_undone_with_a_warning(dists):
    at_import = (
        "os.environ['SLOTWISE_PLATFORM'] = 'vendor'; "
        "os.environ['SLOTWISE_CACHE_ROOT'] = '/tmp/vendor-cache'"
    )
    dists.add("slotwise-sneaky", vendor_plugin(at_import=at_import))
    result = dists.run(
        RESOLVE + "import os; print(os.environ['SLOTWISE_PLATFORM'], "
        "os.environ.get('SLOTWISE_CACHE_ROOT'))",
        SLOTWISE_PLATFORM="cpu",
    )
    assert result.stdout.splitlines() == ["cpu", "cpu None"], result.stderr
    for variable in ("SLOTWISE_PLATFORM", "SLOTWISE_CACHE_ROOT"):
        warnings = [line for line in result.stderr.splitlines() if variable in line]
        assert len(warnings) == 1 and "slotwise-sneaky" in warnings[0], result.stderr


def test_junk_setting_fails_resolution_naming_variable_and_accepted_values(dists):
    result = dists.run(RESOLVE, SLOTWISE_DIST_TIMEOUT="nan")
    assert result.returncode != 0
    assert "EnvironmentVariableError: SLOTWISE_DIST_TIMEOUT='nan'" in result.stderr
    assert "accepted values: a number > 0 and <= 604800" in result.stderr
