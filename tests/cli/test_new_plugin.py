"""`slotwise new-plugin NAME`: the package it writes installs and passes the conformance suite.

The oracles are not ours: ruff judges the generated code, pip installs it from its
own pyproject.toml, and `slotwise conformance` (its reference attention in float64,
eager torch for graphs and custom ops) judges the installed plugin.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conformance.conformance_runs import TIMEOUT_S, environment, messages, outcomes, run_cli
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from support import pip_install_into

from slotwise import version
from slotwise.cli import new_plugin_command

cli_main = importlib.import_module("slotwise.cli.main")

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")
NAME = "acme"
#: What every generated plugin holds; --graphs adds GRAPHS_FILE.
FILES = {
    ".github/workflows/conformance.yml",
    "README.md",
    "pyproject.toml",
    "slotwise_acme/__init__.py",
    "slotwise_acme/attention.py",
    "slotwise_acme/custom_ops.py",
    "slotwise_acme/platform.py",
    "slotwise_acme/plugin.py",
    "tests/test_conformance.py",
}
GRAPHS_FILE = "slotwise_acme/graphs.py"


@pytest.fixture
def new_plugin(monkeypatch, capsys):
    """main() of `slotwise new-plugin` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli_main, "configure_logging", lambda: None)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli_main.main(["new-plugin", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def generate(new_plugin, folder: Path, *args: str) -> Path:
    code, _, err = new_plugin(NAME, "--path", str(folder), *args)
    assert code == 0, err
    return folder


@pytest.mark.parametrize(
    "name, problem",
    [
        *((name, "must be lower-case letters, digits and underscores") for name in
          ("Acme", "1acme", "ac-me", "acme npu", "_acme", "")),
        ("a" * 25, "has 25 characters; new-plugin takes up to 24"),
        # Its device variable would be SLOTWISE_..._DEVICES, a name slotwise owns.
        *((name, "in slotwise's own SLOTWISE_* namespace") for name in
          ("slotwise", "slotwise_npu")),
    ],
)  # fmt: skip
def test_a_bad_platform_name_is_refused(new_plugin, tmp_path, monkeypatch, name, problem):
    monkeypatch.chdir(tmp_path)
    code, out, err = new_plugin(name)
    assert code == 2
    assert f"platform name {name!r}" in err and problem in err and "e.g. 'myvendor'" in err
    assert out == "" and list(tmp_path.iterdir()) == []


def test_the_name_of_an_installed_platform_is_refused(new_plugin, tmp_path):
    code, _, err = new_plugin("cpu", "--path", str(tmp_path / "plugin"))
    assert code == 2
    assert "'cpu' is already declared by the installed plugin 'cpu'" in err
    assert "choose another name" in err
    assert not (tmp_path / "plugin").exists()


def test_a_folder_that_is_not_empty_is_refused_and_left_alone(new_plugin, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    code, _, err = new_plugin(NAME, "--path", str(folder))
    assert code == 2
    assert f"{folder} exists and is not empty" in err and "--path" in err
    assert files_under(folder) == {"notes.txt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no staging left


def test_an_empty_folder_is_filled(new_plugin, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    assert files_under(generate(new_plugin, folder)) == FILES


def test_default_folder_and_next_steps(new_plugin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = new_plugin(NAME)
    assert code == 0
    assert files_under(tmp_path / "slotwise-acme") == FILES
    assert all(f"  {file}\n" in out for file in FILES)
    # "./": pip reads a bare "slotwise-acme" as a project to download, not this folder.
    for step in ("pip install -e ./slotwise-acme", "export ACME_DEVICES=1", "conformance acme"):
        assert step in out


def test_an_underscored_name_gives_a_hyphenated_distribution(new_plugin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = new_plugin("my_npu")
    assert code == 0
    pyproject = (tmp_path / "slotwise-my-npu/pyproject.toml").read_text()
    assert 'name = "slotwise-my-npu"' in pyproject
    assert 'my_npu = "slotwise_my_npu.plugin"' in pyproject
    assert "export MY_NPU_DEVICES=1" in out


def test_the_core_is_pinned_to_the_releases_compatible_with_this_one(new_plugin, tmp_path):
    pyproject = (generate(new_plugin, tmp_path / "p") / "pyproject.toml").read_text()
    (line,) = [line for line in pyproject.splitlines() if line.startswith("dependencies = ")]
    (pin,) = [Requirement(d) for d in json.loads(line.partition("= ")[2]) if "slotwise" in d]
    assert pin.name == "slotwise"
    assert pin.specifier.contains(version.__version__)
    assert pin.specifier == SpecifierSet(
        new_plugin_command.compatible_releases(version.__version__)
    )


@pytest.mark.parametrize(
    "release, accepted, refused",
    [
        ("0.1.0", ["0.1.0", "0.1.9"], ["0.0.9", "0.2.0", "1.0"]),
        ("0.10.3", ["0.10.0", "0.10.7"], ["0.9.9", "0.11.0"]),
        ("1.4.2", ["1.4.0", "1.9"], ["1.3.9", "2.0"]),
    ],
)
def test_compatible_releases_stop_at_the_next_breaking_one(release, accepted, refused):
    specifier = SpecifierSet(new_plugin_command.compatible_releases(release))
    assert [v for v in accepted + refused if specifier.contains(v)] == accepted


def test_the_help_says_static_graphs_are_off_unless_asked_for():
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "new-plugin", "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = " ".join(result.stdout.split())
    assert "Without it (the default) the platform has no static graphs" in text
    assert "no static graphs unless --graphs is given" in text


@pytest.mark.parametrize("graphs", [False, True])
def test_json_lists_exactly_the_files_written(new_plugin, tmp_path, graphs):
    folder = tmp_path / "plugin"
    graphs_flag = "--graphs" if graphs else "--no-graphs"
    code, out, _ = new_plugin(NAME, "--path", str(folder), graphs_flag, "--json")
    assert code == 0
    result = json.loads(out)
    assert result == {
        "name": NAME,
        "path": str(folder.resolve()),
        "files": sorted(files_under(folder)),
        "graphs": graphs,
    }
    assert set(result["files"]) == (FILES | {GRAPHS_FILE} if graphs else FILES)


def test_a_failure_half_way_leaves_nothing(new_plugin, tmp_path, monkeypatch):
    write_text = Path.write_text

    def failing(self: Path, *args, **kwargs):
        if self.name == "platform.py":
            raise OSError("disk full")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing)
    code, out, err = new_plugin(NAME, "--path", str(tmp_path / "plugin"))
    assert code == 2 and out == ""
    assert err == (
        f"slotwise new-plugin: error: cannot write the plugin to {tmp_path / 'plugin'}: "
        f"{tmp_path / 'plugin'}: disk full; choose a --path in a folder you can write to\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "under, problem",
    [
        ("a-file", "{tmp}/a-file: exists and is not a folder"),
        ("a-file/deeper", "{tmp}/a-file/deeper: not a directory"),
    ],
)
def test_a_folder_that_cannot_be_made_is_named_in_one_line(new_plugin, tmp_path, under, problem):
    (tmp_path / "a-file").write_text("in the way")
    path = tmp_path / under / "plugin"
    code, out, err = new_plugin(NAME, "--path", str(path))
    assert code == 2 and out == ""
    assert err == (
        f"slotwise new-plugin: error: cannot write the plugin to {path}: "
        f"{problem.format(tmp=tmp_path)}; choose a --path in a folder you can write to\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_folder_it_may_not_write_in_is_named(new_plugin, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes in folders without write permission (root)")
        code, _, err = new_plugin(NAME, "--path", str(locked / "plugin"))
    finally:
        locked.chmod(0o700)
    assert code == 2
    assert f"cannot write the plugin to {locked / 'plugin'}: {locked}: permission denied" in err


def test_the_platform_name_is_written_once(new_plugin, tmp_path):
    package = generate(new_plugin, tmp_path / "plugin", "--graphs") / "slotwise_acme"
    mentions = {path.name: path.read_text().count(f'"{NAME}"') for path in package.glob("*.py")}
    assert mentions == {name: 0 for name in mentions} | {"plugin.py": 1}, mentions


#: The longest name accepted, with the longest class names (no underscore to drop).
LONGEST_NAME = "abcdefghijklmnopqrstuvwx"


@pytest.mark.parametrize("name", [NAME, LONGEST_NAME])
@pytest.mark.parametrize("graphs", ["--no-graphs", "--graphs"])
def test_generated_python_passes_ruff(new_plugin, tmp_path, graphs, name):
    assert len(LONGEST_NAME) == new_plugin_command.MAX_NAME_LENGTH
    code, _, err = new_plugin(name, "--path", str(tmp_path / "plugin"), graphs)
    assert code == 0, err
    folder = tmp_path / "plugin"
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [str(RUFF), *command, "--no-cache", "."], cwd=folder, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_template_is_found_through_importlib_resources():
    templates = new_plugin_command.TEMPLATES
    used = [*new_plugin_command.FILES, *new_plugin_command.GRAPH_FILES]
    used += [
        f"fragments/{fragment}.{variant}.tmpl"
        for fragment in new_plugin_command.FRAGMENTS
        for variant in ("graphs", "none")
    ]
    assert [name for name in used if not (templates / name).is_file()] == []


@pytest.mark.slow
def test_the_wheel_of_slotwise_carries_every_template(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("slotwise-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packaged = {n for n in archive.namelist() if n.endswith(".tmpl")}
    source = ROOT / "core/slotwise/cli/plugin_template"
    expected = {f"slotwise/cli/plugin_template/{name}" for name in files_under(source)}
    assert packaged == expected


# -- installed, then checked by the conformance suite (slow: a subprocess run each) ------


def install(new_plugin, tmp_path: Path, *args: str) -> tuple[Path, Path]:
    """Generate the plugin and pip-install it into a folder of its own: (plugin, site)."""
    folder = generate(new_plugin, tmp_path / "plugin", *args)
    site = tmp_path / "site"
    pip_install_into(site, folder)
    return folder, site


@pytest.mark.slow
def test_without_graphs_it_passes_conformance_and_its_own_tests(new_plugin, tmp_path):
    folder, site = install(new_plugin, tmp_path, "--no-graphs")
    summary, result = run_cli(NAME, site=site, ACME_DEVICES="1", SLOTWISE_STRICT_PLUGINS="1")
    assert result.returncode == 0, result.stderr[-5000:]
    assert set(outcomes(summary).values()) <= {"passed", "skipped"}, json.dumps(summary)
    assert outcomes(summary)["attention"] == "passed"
    assert "get_graph_api() returns None" in messages(summary, "static_graphs")
    # One visible device: the two ranks of the collectives check cannot each claim one.
    assert "make 2 visible (ACME_DEVICES)" in messages(summary, "communicator")

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=folder,
        env=environment(site, ACME_DEVICES="1", SLOTWISE_STRICT_PLUGINS="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert tests.returncode == 0, tests.stdout[-5000:]
    assert "8 passed" in tests.stdout


@pytest.mark.slow
def test_with_graphs_it_is_selected_and_passes_every_check(new_plugin, tmp_path):
    _, site = install(new_plugin, tmp_path, "--graphs")
    env = subprocess.run(
        [sys.executable, "-m", "slotwise", "env", "--json"],
        env=environment(site, ACME_DEVICES="2", SLOTWISE_STRICT_PLUGINS="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert json.loads(env.stdout)["platform"] == NAME, env.stderr  # priority 200 wins

    summary, result = run_cli(NAME, site=site, ACME_DEVICES="2", SLOTWISE_STRICT_PLUGINS="1")
    assert result.returncode == 0, result.stderr[-5000:]
    # Two devices: the collectives run too; static graphs replay like eager.
    assert set(outcomes(summary).values()) == {"passed"}, json.dumps(summary)

    summary, result = run_cli(NAME, site=site, SLOTWISE_STRICT_PLUGINS="1")
    assert result.returncode == 2
    assert "ACME_DEVICES is not set" in summary["error"]
