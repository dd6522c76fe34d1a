"""Code planted in Inductor's default cache folder by another user never runs.

Inductor imports the generated ``.py`` files it finds in its cache folder by name (the
hash of the code), and its default folder's name (``<tmp>/torchinductor_<user>``) is
known in advance. Here another user created that folder first (mode 777) and planted the
code a level-3 compile generates, each file extended to leave a marker when imported.
With a cache root slotwise refuses, the compile must not touch that folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import LEVEL3_INDUCTOR_AGAINST_EAGER, clean_env

pytestmark = [
    pytest.mark.slow,  # three processes compile with Inductor
    pytest.mark.skipif(
        not hasattr(os, "getuid") or os.getuid() != 0,
        reason="giving folders to another user needs root",
    ),
]

OTHER_UID = 1000
COMPILE = (
    """
import logging, sys
import torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
"""
    + LEVEL3_INDUCTOR_AGAINST_EAGER
    + """
# Imported last: importing Inductor imports Dynamo, which fixes Inductor's folder.
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
print(default_cache_dir())
"""
)


def compile_in_a_process(root: Path, temporary: Path, **env: str) -> subprocess.CompletedProcess:
    environment = clean_env(SLOTWISE_CACHE_ROOT=str(root), TMPDIR=str(temporary), **env)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, env=environment,
        timeout=600,
    )  # fmt: skip


def plant(generated: Path, folder: Path, marker: Path) -> None:
    """A copy of Inductor's folder ``generated`` at ``folder``, every generated module
    first writing ``marker`` when imported."""
    shutil.copytree(generated, folder)
    modules = list(folder.rglob("*.py"))
    assert modules, f"Inductor generated no code in {generated}"
    for module in modules:
        module.write_text(f"open({str(marker)!r}, 'a').write('planted code ran')\n"
                          + module.read_text())  # fmt: skip


def snapshot(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.lstat().st_mtime_ns for path in folder.rglob("*")}


def test_code_planted_in_inductors_default_folder_never_runs(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    marker = tmp_path / "marker"

    # What the victim's compile generates, made in a cache root of the test's own.
    made = compile_in_a_process(tmp_path / "own-root", temporary)
    assert made.returncode == 0, made.stderr
    default = Path(made.stdout.split()[-1])
    assert default.parent == temporary
    # Nothing of Inductor's went to its default folder, precompiled headers included.
    assert not default.exists()
    (generated,) = (tmp_path / "own-root" / "inductor").iterdir()

    # The plant works: a process whose Inductor folder holds it runs the planted code.
    plant(generated, tmp_path / "planted-but-trusted", marker)
    shown = compile_in_a_process(
        tmp_path / "control-root", temporary,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "planted-but-trusted"),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert marker.exists(), "the planted code did not run: this test would prove nothing"
    marker.unlink()

    # Another user got there first: the default folder is theirs, mode 777, code planted.
    plant(generated, default, marker)
    for path in [default, *default.rglob("*")]:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
        os.chmod(path, 0o777)
    before = snapshot(default)
    foreign_root = tmp_path / "foreign-root"
    foreign_root.mkdir(mode=0o755)
    os.chown(foreign_root, OTHER_UID, OTHER_UID)

    victim = compile_in_a_process(foreign_root, temporary)
    assert victim.returncode == 0, victim.stderr
    assert not marker.exists(), "code planted in Inductor's default folder ran"
    assert snapshot(default) == before  # not read into, not written to
    assert "the compile cache root is not trusted" in victim.stderr
    assert f"owned by uid {OTHER_UID}" in victim.stderr
    assert "cached in a private temporary folder of this process only" in victim.stderr
    assert "nothing compiled now is kept for the next process" in victim.stderr
    assert not list(foreign_root.iterdir())  # nothing written into the refused root
    assert not list(temporary.glob("slotwise-inductor-*"))  # the private folder is gone
