"""Every process finds the plugins installed now, read through importlib.metadata.

Each test installs real distributions (``*.dist-info`` folders, tests/support.py) and
runs ``slotwise env --json`` in a fresh interpreter with a home of its own, as a user
would after changing the installation.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from support import Distributions

from slotwise.plugins import ENTRY_POINT_GROUP

#: Two plugin objects in one module, each offering one platform that outranks cpu: the
#: entry point's value decides which platform ``slotwise env`` selects.
TWO_PLUGINS = """
    from types import SimpleNamespace

    from slotwise.plugin_api import Platform, PlatformSpec, hookimpl

    class One(Platform):
        name = "one"
        device_type = "cpu"

    class Two(Platform):
        name = "two"
        device_type = "cpu"

    def offering(platform):
        @hookimpl
        def slotwise_platforms():
            return [PlatformSpec(platform.name, f"{__name__}:{platform.__name__}",
                                 lambda: True, priority=300)]
        return SimpleNamespace(slotwise_platforms=slotwise_platforms)

    one = offering(One)
    two = offering(Two)
"""


def run_env(
    dists: Distributions, home: Path, *later_folders: Path
) -> subprocess.CompletedProcess[str]:
    """``slotwise env --json`` in a fresh interpreter seeing ``dists``, then ``later_folders``."""
    home.mkdir(exist_ok=True)
    paths = [*map(str, later_folders), os.environ.get("PYTHONPATH", "")]
    result = dists.run(
        "from slotwise.cli.main import main\nraise SystemExit(main(['env', '--json']))",
        HOME=str(home),
        PYTHONPATH=os.pathsep.join(path for path in paths if path),
    )
    assert result.returncode == 0, result.stderr
    return result


def slotwise_env(dists: Distributions, home: Path, *later_folders: Path) -> dict[str, Any]:
    """What ``run_env`` printed, parsed."""
    return json.loads(run_env(dists, home, *later_folders).stdout)


def plugin_rows(info: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [row for row in info["plugins"] if row["plugin"] == name]


def test_an_entry_points_file_rewritten_with_equal_size_and_restored_mtime_is_seen(dists, tmp_path):
    module = dists.add("t-switch", TWO_PLUGINS)
    entry_points = dists.root / f"{module}-1.0.dist-info" / "entry_points.txt"
    entry_points.write_text(f"[{ENTRY_POINT_GROUP}]\nt_switch = t_switch:one\n")
    # Installed long ago: no change is too recent for any timestamp to tell.
    long_ago = time.time_ns() - 3600 * 10**9
    for folder, _, files in os.walk(dists.root):
        for name in files:
            os.utime(os.path.join(folder, name), ns=(long_ago, long_ago))
        os.utime(folder, ns=(long_ago, long_ago))
    assert slotwise_env(dists, tmp_path / "home")["platform"] == "one"

    before = entry_points.stat()
    entry_points.write_text(f"[{ENTRY_POINT_GROUP}]\nt_switch = t_switch:two\n")
    os.utime(entry_points, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = entry_points.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )

    info = slotwise_env(dists, tmp_path / "home")
    assert info["platform"] == "two"
    (row,) = plugin_rows(info, "t_switch")
    assert (row["distribution"], row["version"]) == ("t-switch", "1.0")


def test_a_distribution_twice_on_sys_path_is_the_first_one(dists, tmp_path):
    dists.add("t-twin", "", version="1.0")
    later = Distributions(tmp_path / "later")
    later.root.mkdir()
    later.add("t-twin", "", version="2.0")
    (row,) = plugin_rows(slotwise_env(dists, tmp_path / "home", later.root), "t_twin")
    assert (row["distribution"], row["version"], row["status"]) == ("t-twin", "1.0", "loaded")


def test_of_two_distributions_declaring_one_plugin_name_the_first_is_loaded_with_a_warning(
    dists, tmp_path
):
    dists.add("t-dup-first", "", entry_point="t_dup", version="1.0")
    later = Distributions(tmp_path / "later")
    later.root.mkdir()
    later.add(
        "t-dup-second",
        "raise ImportError('must not be imported')",
        entry_point="t_dup",
        version="2.0",
    )
    result = run_env(dists, tmp_path / "home", later.root)
    (row,) = plugin_rows(json.loads(result.stdout), "t_dup")
    assert (row["distribution"], row["status"]) == ("t-dup-first", "loaded")
    (warning,) = [line for line in result.stderr.splitlines() if "t_dup" in line]
    assert warning == (
        "WARNING slotwise: plugin 't_dup' (distribution t-dup-first 1.0) shares its name with "
        "the plugin of distribution t-dup-second 2.0 ('t_dup_second'), which slotwise "
        "therefore does not load; uninstall one of the two distributions, or rename one's "
        "entry point"
    )


def test_a_malformed_entry_point_value_fails_that_plugin_naming_the_value_and_fix(dists, tmp_path):
    module = dists.add("t-malformed", "")
    entry_points = dists.root / f"{module}-1.0.dist-info" / "entry_points.txt"
    entry_points.write_text(f"[{ENTRY_POINT_GROUP}]\nt_malformed = not a module!\n")
    info = slotwise_env(dists, tmp_path / "home")
    assert info["platform"] == "cpu"
    (row,) = plugin_rows(info, "t_malformed")
    assert (row["distribution"], row["version"], row["status"]) == ("t-malformed", "1.0", "failed")
    assert row["reason"] == (
        "failed to load 'not a module!': ValueError: entry point value 'not a module!' is "
        "not 'module' or 'module:attribute'; fix the entry point in the distribution's "
        "pyproject.toml and reinstall it"
    )
