"""Plugin code cannot take ``slotwise`` down: plugins that spin, exit, leave threads
running or answer oddly, installed as real distributions, met by ``slotwise env --json``
run as the command (``main()`` for the process's own command line) in a fresh process.

The time limits are set small (SLOTWISE_PLUGIN_TIMEOUT, SLOTWISE_PROBE_TIMEOUT) so that
a spinning plugin costs each test half a second.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from support import Distributions

#: ``slotwise env --json``, exactly as the console script runs it.
ENV_COMMAND = """
import sys
sys.argv = ["slotwise", "env", "--json"]
from slotwise.cli.main import main
sys.exit(main())
"""


def plugin(*, at_import: str = "", platforms: str = "return []", registration: str = "") -> str:
    """Source of a plugin: code run at import, the body of its ``slotwise_platforms`` hook
    and, when given, of its attention-registration hook."""
    source = f"""
        import os, sys, threading, time
        from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

        {at_import}

        class VendorPlatform(Platform):
            name = "vendor"
            device_type = "cpu"

        @hookimpl
        def slotwise_platforms():
            {platforms}
    """
    if registration:
        source += f"""
        @hookimpl
        def slotwise_register_attention_backends(registry):
            {registration}
        """
    return source


VENDOR_SPEC = 'PlatformSpec("vendor", __name__ + ":VendorPlatform", {probe}, priority=200)'


def slotwise_env(dists: Distributions, **env: str) -> subprocess.CompletedProcess[str]:
    """``slotwise env --json`` in a fresh process seeing ``dists``; a hang fails the test."""
    return dists.run(ENV_COMMAND, **env)


def answer(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON ``slotwise env --json`` printed: stdout holds it alone."""
    return json.loads(result.stdout)


def row(info: dict[str, Any], plugin: str) -> dict[str, Any]:
    (found,) = [r for r in info["plugins"] if r["plugin"] == plugin and r["kind"] == "plugin"]
    return found


def failed_row(result: subprocess.CompletedProcess[str], name: str) -> dict:
    """Plugin ``name``'s row in an env report that still answered, on the CPU platform,
    with that plugin failed."""
    assert result.returncode == 0, result.stderr
    info = answer(result)
    assert info["platform"] == "cpu"
    failed = row(info, name)
    assert failed["status"] == "failed"
    return failed


def warnings_about(stderr: str, distribution: str) -> list[str]:
    return [line for line in stderr.splitlines() if f"distribution {distribution}" in line]


def test_an_import_that_spins_forever_fails_its_plugin_at_the_time_limit(dists):
    dists.add("t-spin", plugin(at_import="while True: pass"))
    result = slotwise_env(dists, SLOTWISE_PLUGIN_TIMEOUT="0.5")
    failed = failed_row(result, "t_spin")
    assert failed["reason"] == (
        "failed to load 't_spin': its import timed out after 0.5 s and was left running in "
        "the background; if it is only slow, raise SLOTWISE_PLUGIN_TIMEOUT (now 0.5 s)"
    )
    (warning,) = warnings_about(result.stderr, "t-spin 1.0")
    assert "timed out after 0.5 s" in warning and "skipped" in warning


@pytest.mark.parametrize(
    ("hook", "code"),
    [
        ("slotwise_platforms", {"platforms": "while True: pass"}),
        ("slotwise_register_attention_backends", {"registration": "while True: pass"}),
    ],
)
def test_a_hook_that_spins_forever_fails_its_plugin_at_the_time_limit(dists, hook, code):
    dists.add("t-spin", plugin(**code))
    result = slotwise_env(dists, SLOTWISE_PLUGIN_TIMEOUT="0.5")
    failed = failed_row(result, "t_spin")
    assert failed["reason"].startswith(f"hook {hook} timed out after 0.5 s")
    assert "raise SLOTWISE_PLUGIN_TIMEOUT" in failed["reason"]
    (warning,) = warnings_about(result.stderr, "t-spin 1.0")
    assert f"hook {hook} timed out" in warning


def test_sys_exit_at_import_fails_the_plugin_and_env_still_answers(dists):
    dists.add("t-exit", plugin(at_import="sys.exit(3)"))
    result = slotwise_env(dists)
    failed = failed_row(result, "t_exit")
    assert failed["reason"] == (
        "failed to load 't_exit': its import called sys.exit(3), which would end the "
        "process; plugin code must raise an exception instead"
    )


@pytest.mark.parametrize(
    ("code", "action"),
    [
        ({"at_import": "os._exit(7)"}, "import of 't_vanish'"),
        (
            {"platforms": "return [" + VENDOR_SPEC.format(probe="lambda: os._exit(7)") + "]"},
            "probe of platform 'vendor'",
        ),
    ],
)
def test_os_exit_in_plugin_code_ends_the_process_and_the_debug_log_names_the_plugin(
    dists, code, action
):
    # What slotwise cannot catch (docs/plugin-authors.md): os._exit ends the process at
    # once, with the plugin's exit status. The last debug line says who was running.
    dists.add("t-vanish", plugin(**code))
    result = slotwise_env(dists, SLOTWISE_LOGGING_LEVEL="DEBUG")
    assert result.returncode == 7
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"DEBUG slotwise: plugin 't_vanish' (distribution t-vanish 1.0): {action}"
    )


LOOPING_THREAD = """
import atexit
def poll():
    while True:
        time.sleep(0.01)
threading.Thread(target=poll, name="vendor-poller"{daemon}).start()
atexit.register(lambda: print("vendor atexit ran", file=sys.stderr))
"""


def test_a_non_daemon_thread_started_at_import_does_not_keep_the_command_running(dists):
    at_import = LOOPING_THREAD.format(daemon=", daemon=False").replace("\n", "\n        ")
    dists.add("t-thread", plugin(at_import=at_import))
    result = slotwise_env(dists)
    assert result.returncode == 0, result.stderr
    assert answer(result)["platform"] == "cpu"
    (warning,) = [line for line in result.stderr.splitlines() if "vendor-poller" in line]
    assert warning.startswith(
        "WARNING slotwise: thread 'vendor-poller' started by plugin 't_thread' (distribution "
        "t-thread 1.0) during import of 't_thread': it is still running and would keep "
        "slotwise from exiting, so slotwise exits without it."
    )
    assert "vendor atexit ran" in result.stderr  # the exit is orderly but for the thread


def test_a_thread_started_at_import_without_a_daemon_flag_is_a_daemon_thread(dists):
    # Plugin code runs in slotwise's daemon threads, whose threads inherit the flag.
    at_import = LOOPING_THREAD.format(daemon="").replace("\n", "\n        ")
    dists.add("t-thread", plugin(at_import=at_import))
    result = slotwise_env(dists)
    assert result.returncode == 0, result.stderr
    assert answer(result)["platform"] == "cpu"
    assert "vendor-poller" not in result.stderr


def test_a_platforms_hook_returning_none_offers_no_platform_and_breaks_nothing(dists):
    dists.add("t-none", plugin(platforms="return None"))
    vendor = "return [" + VENDOR_SPEC.format(probe="lambda: True") + "]"
    dists.add("t-vendor", plugin(platforms=vendor))
    result = slotwise_env(dists)
    assert result.returncode == 0, result.stderr
    info = answer(result)
    assert info["platform"] == "vendor"
    none = row(info, "t_none")
    assert (none["status"], none["reason"]) == ("loaded", "offers no platform")
    assert not warnings_about(result.stderr, "t-none 1.0")


def test_a_platform_name_with_a_trailing_newline_is_refused(dists):
    spec = 'PlatformSpec("cpu\\n", "slotwise_cpu.platform:CpuPlatform", lambda: True)'
    dists.add("t-newline", plugin(platforms=f"return [{spec}]"))
    result = slotwise_env(dists)
    assert result.returncode == 0, result.stderr
    info = answer(result)
    assert info["platform"] == "cpu"
    assert sorted(r["name"] for r in info["plugins"] if r["kind"] == "platform") == [
        "ascend_stub",
        "cpu",
        "cuda",
    ]
    failed = row(info, "t_newline")
    assert failed["status"] == "failed"
    assert failed["reason"].startswith(
        "hook slotwise_platforms raised ValueError: PlatformSpec.name 'cpu\\n' must be "
        "lower-case letters, digits and underscores"
    )


def test_slotwise_plugins_set_but_empty_loads_no_plugin(dists, tmp_path):
    marker = tmp_path / "imported"
    dists.add("t-marker", plugin(at_import=f"open({str(marker)!r}, 'w').close()"))
    result = slotwise_env(dists, SLOTWISE_PLUGINS="")
    assert result.returncode == 1, result.stderr
    info = answer(result)
    assert info["platform"] is None
    rows = [r for r in info["plugins"] if r["kind"] == "plugin"]
    assert {r["plugin"] for r in rows} >= {"cpu", "cuda", "ascend_stub", "t_marker"}
    assert {(r["status"], r["reason"]) for r in rows} == {
        ("filtered", "SLOTWISE_PLUGINS is set but empty, which loads no plugin")
    }
    assert not marker.exists()
    everything = slotwise_env(dists)  # unset: every plugin
    assert everything.returncode == 0, everything.stderr
    assert row(answer(everything), "t_marker")["status"] == "loaded"
    assert marker.exists()
