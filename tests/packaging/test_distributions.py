"""Each distribution builds as a wheel that carries its entry point."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {
    "slotwise": (ROOT, None),
    "slotwise_cpu": (ROOT / "plugins/cpu", "cpu = slotwise_cpu.plugin"),
    "slotwise_cuda": (ROOT / "plugins/cuda", "cuda = slotwise_cuda.plugin"),
    "slotwise_ascend_stub": (
        ROOT / "plugins/ascend_stub",
        "ascend_stub = slotwise_ascend_stub.plugin",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_distribution_builds_a_wheel_with_its_entry_point(tmp_path, dist):
    source, entry_point = DISTRIBUTIONS[dist]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob(f"{dist}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        assert b"Requires-Dist: slotwise" in metadata or dist == "slotwise"
        if entry_point:
            entry_points = archive.read(
                next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
            ).decode()
            assert "[slotwise.plugins]" in entry_points and entry_point in entry_points
        else:
            assert any(n.startswith("slotwise/platforms/") for n in names)
    # Sources built on the user's machine (the CPU plugin's kernels) ship, every one.
    for folder in source.glob("*/csrc"):
        for path in folder.iterdir():
            assert path.relative_to(source).as_posix() in names
