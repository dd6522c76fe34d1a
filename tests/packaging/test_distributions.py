"""Each distribution builds as a wheel that carries its entry points."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Each distribution's folder, entry-point group and one entry point of it.
DISTRIBUTIONS = {
    "slotwise": (ROOT, "pytest11", "slotwise = slotwise.testing.pytest_plugin"),
    "slotwise_engine": (
        ROOT / "engine",
        "slotwise.cli_commands",
        "generate = slotwise_engine.cli.generate_command",
    ),
    "slotwise_cpu": (ROOT / "plugins/cpu", "slotwise.plugins", "cpu = slotwise_cpu.plugin"),
    "slotwise_cuda": (ROOT / "plugins/cuda", "slotwise.plugins", "cuda = slotwise_cuda.plugin"),
    "slotwise_ascend_stub": (
        ROOT / "plugins/ascend_stub",
        "slotwise.plugins",
        "ascend_stub = slotwise_ascend_stub.plugin",
    ),
}
#: What each distribution's wheel holds, and never the other's.
CORE_FOLDER = "slotwise/platforms/"
#: The engine's dependencies, as its wheel's metadata names them; the core's has none.
MODEL_DEPENDENCIES = (
    b"Requires-Dist: safetensors",
    b"Requires-Dist: tokenizers",
    b"Requires-Dist: jinja2",
)
ENGINE_FOLDER = "slotwise_engine/models/"


@pytest.mark.slow
@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_distribution_builds_a_wheel_with_its_entry_point(tmp_path, dist):
    source, group, entry_point = DISTRIBUTIONS[dist]
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
        entry_points = archive.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
        assert f"[{group}]" in entry_points and entry_point in entry_points
    if dist == "slotwise":
        assert any(n.startswith(CORE_FOLDER) for n in names)
        assert not any(n.startswith(ENGINE_FOLDER) for n in names)
        assert not any(dependency in metadata for dependency in MODEL_DEPENDENCIES)
    if dist == "slotwise_engine":
        # Modules of the core's package, never its __init__.py: installing the engine
        # adds to slotwise, it does not replace it.
        assert any(n.startswith(ENGINE_FOLDER) for n in names)
        assert "slotwise/__init__.py" not in names
        assert not any(n.startswith(CORE_FOLDER) for n in names)
        assert all(dependency in metadata for dependency in MODEL_DEPENDENCIES)
    # Sources built on the user's machine (the CPU plugin's kernels) ship, every one.
    for folder in source.glob("*/csrc"):
        for path in folder.iterdir():
            assert path.relative_to(source).as_posix() in names
