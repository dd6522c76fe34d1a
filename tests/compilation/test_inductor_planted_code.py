"""Code another user plants where Inductor would look never runs in this user's process.

Inductor imports the generated ``.py`` files it finds in its cache folder by name (the
hash of the code). Each test plants the code a level-3 compile generates, every file
extended to leave a marker when imported, where an attacker could put it:

- in Inductor's default folder (``<tmp>/torchinductor_<user>``, a name known in
  advance), created first by another user with mode 777, while slotwise refuses the
  cache root it was given;
- behind a link in a sticky shared folder like /tmp, where anyone may create an entry
  and only its owner may replace it: the link points at a private folder of the
  victim's while slotwise checks it and is re-pointed at the plant once the check is
  made. The victim names the link as ``SLOTWISE_CACHE_ROOT`` or
  ``TORCHINDUCTOR_CACHE_DIR``. Before slotwise refused such links and handed Inductor
  the real path it checked, the planted code ran in the victim's process.

The generated code is made once, and a control compile shows that a plant Inductor is
pointed at really runs, so that the tests cannot pass by planting nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import LEVEL3_INDUCTOR_AGAINST_EAGER, clean_env

pytestmark = [
    pytest.mark.slow,  # each test compiles with Inductor in new processes
    pytest.mark.skipif(
        not hasattr(os, "getuid") or os.getuid() != 0,
        reason="acting as another user needs root",
    ),
]

OTHER_UID = 1000
#: A level-3 Inductor compile checked against eager, then the name of Inductor's default
#: folder. With arguments ``link yours theirs``, the link's owner (OTHER_UID) points
#: ``link`` at ``yours`` whenever slotwise checks Inductor's folder as Inductor's compiler
#: is set up, and at ``theirs`` as soon as the check is made: an attacker who wins every
#: race.
COMPILE = (
    f"""
import logging, subprocess, sys
import torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from slotwise.compilation import compilers

checked = compilers.place_inductor_cache

def point(link, target):
    command = ["ln", "-sfn", target, link]
    subprocess.run(command, check=True, user={OTHER_UID}, group={OTHER_UID})

def check_then_repoint(cache_root):
    if not sys.argv[1:]:
        return checked(cache_root)
    link, yours, theirs = sys.argv[1:]
    point(link, yours)
    folder = checked(cache_root)
    point(link, theirs)
    return folder

compilers.place_inductor_cache = check_then_repoint
"""
    + LEVEL3_INDUCTOR_AGAINST_EAGER
    + """
# Imported last: importing Inductor imports Dynamo, which fixes Inductor's folder.
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
print(default_cache_dir())
"""
)


def compile_in_a_process(*race: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = clean_env(**env)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-c", COMPILE, *race], capture_output=True, text=True,
        env=environment, timeout=600,
    )  # fmt: skip


def as_other_user(*command: str) -> None:
    subprocess.run(command, check=True, user=OTHER_UID, group=OTHER_UID)


@dataclass
class Plant:
    #: Inductor's folder of a compile in a cache root of the test's own.
    generated: Path
    #: Where planted code, once imported, writes.
    marker: Path
    #: Inductor's default folder in the compiles' temporary folder (``TMPDIR``).
    default: Path
    temporary: Path

    def copy_to(self, folder: Path) -> None:
        """A copy of the generated code at ``folder``, every module first writing the
        marker when imported."""
        shutil.copytree(self.generated, folder)
        modules = list(folder.rglob("*.py"))
        assert modules, f"Inductor generated no code in {self.generated}"
        for module in modules:
            module.write_text(f"open({str(self.marker)!r}, 'a').write('planted code ran')\n"
                              + module.read_text())  # fmt: skip


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> Plant:
    folder = tmp_path_factory.mktemp("plant")
    temporary = folder / "tmp"
    temporary.mkdir()
    made = compile_in_a_process(SLOTWISE_CACHE_ROOT=str(folder / "own-root"), TMPDIR=str(temporary))
    assert made.returncode == 0, made.stderr
    default = Path(made.stdout.split()[-1])
    assert default.parent == temporary
    # Nothing of Inductor's went to its default folder, precompiled headers included.
    assert not default.exists()
    (generated,) = (folder / "own-root" / "inductor").iterdir()
    plant = Plant(generated, folder / "marker", default, temporary)

    # The plant works: a process whose Inductor folder holds it runs the planted code.
    plant.copy_to(folder / "planted-but-trusted")
    shown = compile_in_a_process(
        SLOTWISE_CACHE_ROOT=str(folder / "control-root"),
        TORCHINDUCTOR_CACHE_DIR=str(folder / "planted-but-trusted"),
    )
    assert shown.returncode == 0, shown.stderr
    assert plant.marker.exists(), "the planted code did not run: this test would prove nothing"
    plant.marker.unlink()
    return plant


def snapshot(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.lstat().st_mtime_ns for path in folder.rglob("*")}


def test_code_planted_in_inductors_default_folder_never_runs(tmp_path, plant):
    # Another user got there first: the default folder is theirs, mode 777, code planted.
    default = plant.default
    plant.copy_to(default)
    for path in [default, *default.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
        os.chmod(path, 0o777)
    before = snapshot(default)
    foreign_root = tmp_path / "foreign-root"
    foreign_root.mkdir(mode=0o755)
    os.chown(foreign_root, OTHER_UID, OTHER_UID)
    try:
        victim = compile_in_a_process(
            SLOTWISE_CACHE_ROOT=str(foreign_root), TMPDIR=str(plant.temporary)
        )
        assert victim.returncode == 0, victim.stderr
        assert not plant.marker.exists(), "code planted in Inductor's default folder ran"
        assert snapshot(default) == before  # not read into, not written to
    finally:
        shutil.rmtree(default)
    assert "the compile cache root is not trusted" in victim.stderr
    assert f"owned by uid {OTHER_UID}" in victim.stderr
    assert "cached in a private temporary folder of this process only" in victim.stderr
    assert "nothing compiled now is kept for the next process" in victim.stderr
    assert not list(foreign_root.iterdir())  # nothing written into the refused root
    assert not list(plant.temporary.glob("slotwise-inductor-*"))  # the private folder is gone


@pytest.fixture
def shared():
    """A sticky folder everyone may write, like /tmp, that another user can reach (the
    test's own temporary folders are closed to them)."""
    folder = Path(tempfile.mkdtemp(prefix="slotwise-shared-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize("variable", ["SLOTWISE_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"])
def test_a_link_re_pointed_after_the_check_never_brings_in_planted_code(
    tmp_path, shared, plant, variable
):
    # The other user's folder: a cache root whose Inductor folder holds the plant.
    planted = shared / "planted"
    plant.copy_to(planted / "inductor" / plant.generated.name)
    for path in [planted, *planted.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    target = (
        planted
        if variable == "SLOTWISE_CACHE_ROOT"
        else planted / "inductor" / plant.generated.name
    )
    yours = tmp_path / "yours"
    yours.mkdir(mode=0o700)
    temporary = tmp_path / "tmp"
    temporary.mkdir()

    link = shared / "cache"
    as_other_user("ln", "-sfn", str(yours), str(link))
    env = {"SLOTWISE_CACHE_ROOT": str(tmp_path / "victim-root"), variable: str(link)}
    victim = compile_in_a_process(str(link), str(yours), str(target), TMPDIR=str(temporary), **env)
    assert victim.returncode == 0, victim.stderr
    assert os.readlink(link) == str(target)  # re-pointed during the run
    assert not plant.marker.exists(), f"planted code ran through {variable}={link}"
    assert f"{link} is a symbolic link owned by uid {OTHER_UID}" in victim.stderr
    assert "cached in a private temporary folder of this process only" in victim.stderr
    assert not list(yours.iterdir())  # nothing written through the link either
    assert not list(temporary.glob("slotwise-inductor-*"))  # the private folder is gone
