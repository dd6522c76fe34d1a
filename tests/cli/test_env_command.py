"""`slotwise env`, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import clean_env

from slotwise.version import API_VERSION


def slotwise(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotwise", *args],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=120,
    )


def test_env_json_reports_versions_platform_and_every_plugin():
    result = slotwise("env", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["platform"] == "cpu"
    assert info["torch"].startswith("2.")
    assert info["api_version"] == API_VERSION
    assert info["devices"]["count"] >= 1
    assert info["devices"]["list"][0]["total_memory"] > 0
    statuses = {row["name"]: row["status"] for row in info["plugins"]}
    assert statuses == {"cpu": "selected", "cuda": "unavailable", "ascend_stub": "unavailable"}
    distributions = {row["distribution"] for row in info["plugins"]}
    assert distributions == {"slotwise-cpu", "slotwise-cuda", "slotwise-ascend-stub"}


def test_env_table_says_why_the_platform_won():
    result = slotwise("env", SLOTWISE_ASCEND_STUB_DEVICES="2", SLOTWISE_LOGGING_LEVEL="info")
    assert result.returncode == 0, result.stderr
    assert "set      SLOTWISE_LOGGING_LEVEL=info" in result.stdout
    assert "platform ascend_stub: highest priority (" in result.stdout
    assert "devices  2 x Ascend stub NPU 0" in result.stdout
    assert "also available: cpu" not in result.stdout  # cpu is never probed for nothing


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SLOTWISE_PLATFORM": "nope"}, "Known platforms: ascend_stub, cpu, cuda"),
        ({"SLOTWISE_PLUGINS": "cuda"}, "no installed platform is available"),
    ],
)
def test_env_without_a_usable_platform_explains_and_exits_nonzero(env, message):
    result = slotwise("env", **env)
    assert result.returncode == 1
    assert message in result.stdout


def test_console_script_is_installed():
    script = subprocess.run(
        [sys.executable, "-c", "import shutil, sys, os; print(os.path.dirname(sys.executable))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    result = subprocess.run(
        [f"{script}/slotwise", "env", "--json"], capture_output=True, text=True, env=clean_env()
    )
    assert json.loads(result.stdout)["slotwise"]


@pytest.mark.parametrize(
    "variable, value, accepted",
    [
        ("SLOTWISE_STRICT_PLUGINS", "maybe", "1, true, yes, on, 0, false, no, off"),
        ("SLOTWISE_DISABLE_COMPILE_CACHE", "maybe", "1, true, yes, on, 0, false, no, off"),
        ("SLOTWISE_LOGGING_LEVEL", "LOUD", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("SLOTWISE_DIST_TIMEOUT", "1e300", "a number > 0 and <= 604800"),
        ("SLOTWISE_DIST_TIMEOUT", "nan", "a number > 0 and <= 604800"),
        ("SLOTWISE_DIST_TIMEOUT", "-5", "a number > 0 and <= 604800"),
        ("SLOTWISE_PROBE_TIMEOUT", "soon", "a number > 0 and <= 3600"),
    ],
)
def test_junk_setting_is_one_line_naming_variable_value_and_accepted_values(
    variable, value, accepted
):
    result = slotwise("env", **{variable: value})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"slotwise: error: {variable}={value!r} ")
    assert f"accepted values: {accepted}" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_env_json_stays_json_when_a_plugin_prints(dists):
    dists.add(
        "slotwise-chatty",
        """
        from slotwise.platforms import Platform, PlatformSpec
        from slotwise.plugins import hookimpl

        print("chatty: imported")

        class ChattyPlatform(Platform):
            name = "chatty"
            device_type = "cpu"

            def device_count(self, **kwargs):
                print("chatty: devices counted")
                return 0

        def probe():
            print("chatty: probed")
            return True

        @hookimpl
        def slotwise_platforms():
            print("chatty: hook called")
            return [PlatformSpec("chatty", __name__ + ":ChattyPlatform", probe, priority=200)]
        """,
    )
    result = dists.run(
        "from slotwise.cli.main import main\nraise SystemExit(main(['env', '--json']))"
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["platform"] == "chatty"
    for said in ("imported", "probed", "hook called", "devices counted"):
        assert f"chatty: {said}" in result.stderr


MISNAMED_PLUGIN = """
    from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

    class MisnamedPlatform(Platform):
        name = "othername"
        device_type = "cpu"

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("misnamed", __name__ + ":MisnamedPlatform", lambda: True,
                             priority=300)]
"""


def test_env_header_and_table_agree_when_a_class_name_differs_from_its_spec(dists):
    dists.add("slotwise-misnamed", MISNAMED_PLUGIN)
    env = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(dists.root), os.environ.get("PYTHONPATH")) if p
        )
    }
    result = slotwise("env", "--json", **env)
    assert result.returncode == 1, result.stderr
    info = json.loads(result.stdout)
    assert info["platform"] is None
    assert "they must match" in info["error"]
    row = next(r for r in info["plugins"] if r["name"] == "misnamed")
    assert (row["status"], row["reason"]) == ("failed", info["error"])
    assert "selected" not in [r["status"] for r in info["plugins"]]
    table = slotwise("env", **env).stdout
    assert "platform none: " in table
    assert "selected" not in table


FAILING_REGISTRATION_PLUGIN = """
    from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

    class BrokenRegPlatform(Platform):
        name = "brokenreg"
        device_type = "cpu"

        def device_count(self, **kwargs):
            return 1

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("brokenreg", __name__ + ":BrokenRegPlatform", lambda: True,
                             priority=300)]

    @hookimpl
    def slotwise_register_attention_backends(registry):
        raise RuntimeError("no backend today")
"""


def test_a_plugin_whose_registration_hook_raises_is_reported_failed(dists):
    dists.add("slotwise-brokenreg", FAILING_REGISTRATION_PLUGIN)
    env = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(dists.root), os.environ.get("PYTHONPATH")) if p
        )
    }
    result = slotwise("env", "--json", **env)
    assert result.returncode == 1, result.stderr
    info = json.loads(result.stdout)
    reason = "hook slotwise_register_attention_backends raised RuntimeError: no backend today"
    row = next(r for r in info["plugins"] if r["name"] == "brokenreg")
    assert (row["status"], row["reason"]) == ("failed", reason)
    assert info["platform"] is None and reason in info["error"]
    table = slotwise("env", **env)
    assert table.returncode == 1
    assert "selected" not in table.stdout
    assert (
        "platform none: platform 'brokenreg' is unusable: plugin 'slotwise_brokenreg'"
        in table.stdout
    )
    assert reason in table.stderr  # the warning, as every command that ran the hook gives


SPARSE_PLUGIN = """
    from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

    class SparsePlatform(Platform):
        name = "sparse"
        device_type = "cpu"

        def device_count(self, **kwargs):
            return 2

        def get_device_name(self, device_id=0, **kwargs):
            return "Sparse NPU"

        def get_device_capability(self, device_id=0, **kwargs):
            return None

        def total_memory(self, device_id=0, **kwargs):
            raise RuntimeError("driver asleep")

    @hookimpl
    def slotwise_platforms():
        return [PlatformSpec("sparse", __name__ + ":SparsePlatform", lambda: True, priority=300)]
"""


def test_answers_a_platform_cannot_give_are_named_never_shown_as_values(dists):
    dists.add("slotwise-sparse", SPARSE_PLUGIN)
    env = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(dists.root), os.environ.get("PYTHONPATH")) if p
        )
    }
    table = slotwise("env", **env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "devices  2 x Sparse NPU" in lines
    assert not [line for line in lines if line.startswith("memory")]
    assert "unknown  total_memory (sparse raised RuntimeError: driver asleep)" in lines
    assert "unknown  current_memory_usage (not implemented by platform sparse)" in lines
    assert "not implemented in use" not in table.stdout
    devices = json.loads(slotwise("env", "--json", **env).stdout)["devices"]
    assert devices["list"][0]["total_memory"] is None and devices["memory_in_use"] is None
    assert devices["unanswered"] == {
        "total_memory": "raised RuntimeError: driver asleep",
        "current_memory_usage": "not implemented",
    }
