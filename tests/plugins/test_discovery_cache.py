"""The plugin discovery cache is never stale and finds exactly what importlib.metadata finds.

Every run is a fresh interpreter with its own home (so its own cache folder), the
throwaway distributions on PYTHONPATH and a working directory of its own (``python -c``
puts it on sys.path).  A cache is only written for an installation whose files are at
least two seconds old (a later change could otherwise keep their mtime), so the tests
age the files they create before a run that should write or read the cache, and do not
after an install or uninstall: that is how users change an installation.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import Distributions, clean_env

from slotwise.errors import EnvironmentVariableError
from slotwise.plugins import ENTRY_POINT_GROUP
from slotwise.plugins.discovery_cache import find_entry_points
from slotwise.plugins.manager import _load_entry_point

#: Prints the records of the plugin manager, then importlib.metadata's entry points with
#: the manager's documented rule applied (sorted by name, the first of a name wins).
DISCOVER = f"""
import json, logging, sys
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(message)s")
from slotwise.plugins import get_plugin_manager
records = get_plugin_manager().records.values()
print(json.dumps([[r.name, r.value, r.status, r.reason, r.distribution, r.version]
                  for r in records]))
import importlib.metadata
first = {{}}
for ep in sorted(importlib.metadata.entry_points(group={ENTRY_POINT_GROUP!r}),
                 key=lambda ep: ep.name):
    first.setdefault(ep.name, [ep.name, ep.value, ep.dist.name, ep.dist.version])
print(json.dumps(list(first.values())))
"""

HIT = "entry points from cache"
SAVED = "plugin discovery cache: saved"


@dataclass
class Discovery:
    """What one process found: the manager's records, importlib.metadata's, its log."""

    records: list[list[str]]
    oracle: list[list[str]]
    log: str

    @property
    def from_cache(self) -> bool:
        return HIT in self.log

    def plugins(self) -> dict[str, str]:
        """name -> entry point value, for the test's own (non-bundled) plugins."""
        return {r[0]: r[1] for r in self.records if r[0].startswith("t_")}

    def assert_matches_importlib_metadata(self) -> None:
        found = [[name, value, dist, version] for name, value, _, _, dist, version in self.records]
        assert found == self.oracle


@dataclass
class Machine:
    """A home, a working directory and a site folder, as one user's machine."""

    dists: Distributions
    home: Path
    work: Path

    def discover(self, prelude: str = "", **env: str) -> Discovery:
        environ = clean_env(
            HOME=str(self.home),
            PYTHONPATH=str(self.dists.root),
            PYTHONDONTWRITEBYTECODE="1",  # a __pycache__ folder would change the site folder
            **env,
        )
        result = subprocess.run(
            [sys.executable, "-c", prelude + DISCOVER],
            env=environ,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        records, oracle = (json.loads(line) for line in result.stdout.splitlines()[-2:])
        return Discovery(records, oracle, result.stderr)

    def age(self) -> None:
        """Date everything the test created a minute back, as if installed long ago."""
        past = time.time_ns() - 60 * 10**9
        for top in (self.dists.root, self.work):
            for folder, _, files in os.walk(top):
                for name in files:
                    os.utime(os.path.join(folder, name), ns=(past, past))
                os.utime(folder, ns=(past, past))

    @property
    def cache_folder(self) -> Path:
        return self.home / ".cache" / "slotwise" / "discovery"

    def cache_file(self) -> Path:
        (path,) = self.cache_folder.glob("*.bin")
        return path

    def warm(self) -> Discovery:
        """Age the installation, write the cache and check that the next run reads it."""
        self.age()
        written = self.discover()
        assert SAVED in written.log and not written.from_cache, written.log
        read = self.discover()
        assert read.from_cache, read.log
        assert read.records == written.records
        return read


@pytest.fixture
def machine(dists: Distributions, tmp_path: Path) -> Machine:
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    return Machine(dists, tmp_path / "home", tmp_path / "work")


def uninstall(dists: Distributions, module: str, version: str = "1.0") -> None:
    shutil.rmtree(dists.root / f"{module}-{version}.dist-info")
    (dists.root / f"{module}.py").unlink()


def test_install_and_uninstall_between_runs_are_seen(machine):
    machine.dists.add("t-alpha", "", version="1.0")
    first = machine.warm()
    assert first.plugins() == {"t_alpha": "t_alpha"}
    first.assert_matches_importlib_metadata()

    machine.dists.add("t-beta", "", version="2.5")
    installed = machine.discover()
    assert not installed.from_cache
    assert installed.plugins() == {"t_alpha": "t_alpha", "t_beta": "t_beta"}
    installed.assert_matches_importlib_metadata()
    # Installed within the last 2 s: its mtimes could hide a change still to come.
    assert "changed less than 2 s ago" in installed.log and SAVED not in installed.log

    cached = machine.warm()  # a cache that lists t_beta ...
    assert ["t_beta", "t_beta", "loaded", "", "t-beta", "2.5"] in cached.records
    uninstall(machine.dists, "t_beta", version="2.5")
    removed = machine.discover()  # ... is not believed once t_beta is gone
    assert not removed.from_cache
    assert removed.plugins() == {"t_alpha": "t_alpha"}
    removed.assert_matches_importlib_metadata()


def test_an_edited_entry_point_is_seen(machine):
    module = machine.dists.add("t-gamma", "one = 1\ntwo = 2\n")
    machine.warm()
    entry_points = machine.dists.root / f"{module}-1.0.dist-info" / "entry_points.txt"
    entry_points.write_text(f"[{ENTRY_POINT_GROUP}]\nt_gamma = t_gamma:two\n")
    assert machine.discover().plugins() == {"t_gamma": "t_gamma:two"}
    machine.warm()
    # The same size: only the mtime tells this edit apart.
    entry_points.write_text(f"[{ENTRY_POINT_GROUP}]\nt_gamma = t_gamma:one\n")
    edited = machine.discover()
    assert not edited.from_cache
    assert edited.plugins() == {"t_gamma": "t_gamma:one"}
    edited.assert_matches_importlib_metadata()


def test_a_new_distribution_folder_with_no_entry_point_file_yet_is_seen(machine):
    machine.dists.add("t-delta", "")
    machine.warm()
    entry_points = machine.dists.root / "t_delta-1.0.dist-info" / "entry_points.txt"
    entry_points.unlink()
    assert machine.discover().plugins() == {}
    machine.warm()
    entry_points.write_text(f"[{ENTRY_POINT_GROUP}]\nt_delta = t_delta\n")
    assert machine.discover().plugins() == {"t_delta": "t_delta"}


def test_records_are_those_of_importlib_metadata_with_broken_and_duplicate_plugins(machine):
    machine.dists.add("t-ok", "", version="3.1")
    machine.dists.add("t-broken", "raise ImportError('no driver')")
    machine.dists.add("t-bad-value", "")
    info = machine.dists.root / "t_bad_value-1.0.dist-info" / "entry_points.txt"
    info.write_text(f"[{ENTRY_POINT_GROUP}]\nt_bad = not a module!\n")
    # Two distributions offering one entry-point name: importlib.metadata's first wins.
    machine.dists.add("t-dup-one", "", entry_point="t_dup")
    machine.dists.add("t-dup-two", "", entry_point="t_dup")
    cached = machine.warm()
    uncached = machine.discover(SLOTWISE_DISABLE_DISCOVERY_CACHE="1")
    assert not uncached.from_cache
    assert cached.records == uncached.records
    cached.assert_matches_importlib_metadata()
    statuses = {r[0]: (r[2], r[3]) for r in cached.records if r[0].startswith("t_")}
    assert statuses["t_ok"] == ("loaded", "")
    assert statuses["t_broken"] == (
        "failed",
        "failed to load 't_broken': ImportError: no driver",
    )
    assert statuses["t_bad"][0] == "failed"
    assert "'not a module!' is not 'module' or 'module:attribute'" in statuses["t_bad"][1]


def test_the_bundled_plugins_come_from_the_cache_with_their_distributions(machine):
    cached = machine.warm()
    names = {r[0]: (r[4], r[5]) for r in cached.records}
    assert names["cpu"] == ("slotwise-cpu", importlib.metadata.version("slotwise-cpu"))
    cached.assert_matches_importlib_metadata()
    assert "importlib.metadata" not in cached.log  # no fallback line


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda blob: b"garbage" + blob[7:], id="overwritten"),
        pytest.param(lambda blob: blob[: len(blob) // 2], id="truncated"),
        pytest.param(lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]), id="one-bit"),
    ],
)
def test_a_damaged_cache_file_is_ignored_and_rewritten(machine, damage):
    machine.dists.add("t-eps", "")
    expected = machine.warm().records
    path = machine.cache_file()
    path.write_bytes(damage(path.read_bytes()))
    damaged = machine.discover()
    assert not damaged.from_cache
    assert f"WARNING plugin discovery cache {path} is damaged" in damaged.log
    assert damaged.records == expected
    assert machine.discover().from_cache


@pytest.mark.parametrize("problem", ["group-writable", "foreign-owned"])
def test_an_untrusted_cache_file_is_ignored_and_replaced(machine, problem):
    machine.dists.add("t-eps", "")
    expected = machine.warm().records
    path = machine.cache_file()
    if problem == "group-writable":
        path.chmod(0o620)
        reason = "is writable by group or others (mode 620)"
    else:
        if os.getuid() != 0:
            pytest.skip("only root can give a file to another user")
        os.chown(path, 4242, -1)
        reason = "is owned by uid 4242"
    ignored = machine.discover()
    assert not ignored.from_cache
    assert f"WARNING plugin discovery cache {path} ignored and rebuilt" in ignored.log
    assert reason in ignored.log
    assert ignored.records == expected
    status = path.stat()
    assert status.st_uid == os.getuid() and stat.S_IMODE(status.st_mode) == 0o600
    assert machine.discover().from_cache


def test_a_cache_folder_others_can_write_is_neither_read_nor_written(machine):
    machine.dists.add("t-eps", "")
    expected = machine.warm().records
    machine.cache_folder.chmod(0o770)
    path = machine.cache_file()
    path.write_bytes(b"planted by a group member")
    untrusted = machine.discover()
    assert "WARNING plugin discovery cache not trusted" in untrusted.log
    assert "chmod 700" in untrusted.log
    assert not untrusted.from_cache
    assert untrusted.records == expected
    assert path.read_bytes() == b"planted by a group member"


ANOTHER_DISTRIBUTION_FINDER = """
import sys
class Finder:
    @staticmethod
    def find_spec(*args):
        return None
    @staticmethod
    def find_distributions(*args, **kwargs):
        return iter(())
sys.meta_path.append(Finder)
"""


def test_a_finder_of_other_distributions_turns_the_cache_off(machine):
    machine.dists.add("t-eps", "")
    machine.warm()
    other = machine.discover(prelude=ANOTHER_DISTRIBUTION_FINDER)
    assert not other.from_cache
    assert "sys.meta_path has distribution finders" in other.log
    other.assert_matches_importlib_metadata()


def test_the_switch_turns_the_cache_off(machine):
    machine.dists.add("t-eps", "")
    machine.age()
    for _ in range(2):
        off = machine.discover(SLOTWISE_DISABLE_DISCOVERY_CACHE="1")
        assert not off.from_cache
        off.assert_matches_importlib_metadata()
    assert not machine.cache_folder.exists()


def test_a_junk_switch_value_is_an_error_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("SLOTWISE_DISABLE_DISCOVERY_CACHE", "maybe")
    with pytest.raises(EnvironmentVariableError, match="SLOTWISE_DISABLE_DISCOVERY_CACHE='maybe'"):
        find_entry_points(ENTRY_POINT_GROUP, str(tmp_path / "cache"))


def test_in_process_results_equal_importlib_metadata(tmp_path):
    folder = str(tmp_path / "cache")
    oracle = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    for _ in range(2):  # the second answer may come from the cache
        found = find_entry_points(ENTRY_POINT_GROUP, folder)
        assert [(ep.name, ep.value, ep.dist.name, ep.dist.version) for ep in found] == [
            (ep.name, ep.value, ep.dist.name, ep.dist.version) for ep in oracle
        ]


@pytest.mark.parametrize(
    "value",
    ["os", "os.path", "os.path:join", "os.path : join", "os:path.join",
     "json [extra]", "json:dumps [one, two]"],
)  # fmt: skip
def test_entry_points_load_what_importlib_metadata_loads(value):
    oracle = importlib.metadata.EntryPoint(name="x", value=value, group=ENTRY_POINT_GROUP)
    assert _load_entry_point(value) is oracle.load()


@pytest.mark.parametrize("value", ["os path", "os:", ":join", "1os", "os:join.", "json [x"])
def test_a_malformed_entry_point_value_is_an_error_naming_it(value):
    with pytest.raises(ValueError, match=r"is not 'module' or 'module:attribute'; fix"):
        _load_entry_point(value)
