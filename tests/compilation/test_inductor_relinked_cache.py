"""A cache folder reached through another user's link: re-pointed after the check, the
planted code still never runs.

In a sticky shared folder like /tmp anyone may create an entry, and only its owner may
replace it. Here another user made ``<shared>/cache`` a link to a folder of the victim's
own, so a check that follows the link sees a private folder of the victim's; once the
check is made, the link's owner re-points it at a folder of theirs holding the code a
level-3 compile generates, each module extended to leave a marker when imported. The
victim names the link as ``SLOTWISE_CACHE_ROOT`` or ``TORCHINDUCTOR_CACHE_DIR``. Before
slotwise refused such links and handed Inductor the real path it checked, the planted
code ran in the victim's process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support import LEVEL3_INDUCTOR_AGAINST_EAGER, clean_env

pytestmark = [
    pytest.mark.slow,  # four processes compile with Inductor
    pytest.mark.skipif(
        not hasattr(os, "getuid") or os.getuid() != 0,
        reason="acting as another user needs root",
    ),
]

OTHER_UID = 1000
#: A level-3 Inductor compile checked against eager. With arguments ``link yours theirs``,
#: the link's owner (OTHER_UID) points ``link`` at ``yours`` whenever slotwise checks
#: Inductor's folder as Inductor's compiler is set up, and at ``theirs`` as soon as the
#: check is made: an attacker who wins every race.
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


def plant(generated: Path, folder: Path, marker: Path) -> None:
    """A copy of Inductor's folder ``generated`` at ``folder``, every generated module
    first writing ``marker`` when imported."""
    shutil.copytree(generated, folder)
    modules = list(folder.rglob("*.py"))
    assert modules, f"Inductor generated no code in {generated}"
    for module in modules:
        module.write_text(f"open({str(marker)!r}, 'a').write('planted code ran')\n"
                          + module.read_text())  # fmt: skip


@pytest.fixture
def shared():
    """A sticky folder everyone may write, like /tmp, that another user can reach (the
    test's own temporary folders are closed to them)."""
    folder = Path(tempfile.mkdtemp(prefix="slotwise-shared-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


def test_a_link_re_pointed_after_the_check_never_brings_in_planted_code(tmp_path, shared):
    marker = tmp_path / "marker"
    temporary = tmp_path / "tmp"
    temporary.mkdir()

    # What the victim's compile generates, made in a cache root of the test's own.
    made = compile_in_a_process(SLOTWISE_CACHE_ROOT=str(tmp_path / "own-root"))
    assert made.returncode == 0, made.stderr
    (generated,) = (tmp_path / "own-root" / "inductor").iterdir()

    # The plant works: a process whose Inductor folder holds it runs the planted code.
    plant(generated, tmp_path / "planted-but-trusted", marker)
    shown = compile_in_a_process(
        SLOTWISE_CACHE_ROOT=str(tmp_path / "control-root"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "planted-but-trusted"),
    )
    assert shown.returncode == 0, shown.stderr
    assert marker.exists(), "the planted code did not run: this test would prove nothing"
    marker.unlink()

    # The other user's folder: a cache root whose Inductor folder holds the plant.
    planted = shared / "planted"
    plant(generated, planted / "inductor" / generated.name, marker)
    for path in [planted, *planted.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    yours = tmp_path / "yours"
    yours.mkdir(mode=0o700)

    for variable, target in [
        ("SLOTWISE_CACHE_ROOT", planted),
        ("TORCHINDUCTOR_CACHE_DIR", planted / "inductor" / generated.name),
    ]:
        link = shared / "cache"
        as_other_user("ln", "-sfn", str(yours), str(link))
        env = {"SLOTWISE_CACHE_ROOT": str(tmp_path / "victim-root"), variable: str(link)}
        victim = compile_in_a_process(
            str(link), str(yours), str(target), TMPDIR=str(temporary), **env
        )
        assert victim.returncode == 0, victim.stderr
        assert os.readlink(link) == str(target)  # re-pointed during the run
        assert not marker.exists(), f"planted code ran through {variable}={link}"
        assert f"{link} is a symbolic link owned by uid {OTHER_UID}" in victim.stderr
        assert "cached in a private temporary folder of this process only" in victim.stderr
        assert not list(yours.iterdir())  # nothing written through the link either
        assert not list(temporary.glob("slotwise-inductor-*"))  # the private folder is gone
        link.unlink()
