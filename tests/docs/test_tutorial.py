"""CONTRIBUTING.md's tutorial plugin, assembled from its code blocks, passes the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

ROOT = Path(__file__).resolve().parents[2]
FILE_BLOCK = re.compile(r"^```\w+ file=(?P<path>\S+)\n(?P<body>.*?)^```$", re.M | re.S)


def tutorial_files() -> dict[str, str]:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return {match["path"]: match["body"] for match in FILE_BLOCK.finditer(text)}


def test_the_tutorial_has_every_file_of_a_plugin():
    assert set(tutorial_files()) == {
        "pyproject.toml",
        "slotwise_tutorialchip/__init__.py",
        "slotwise_tutorialchip/plugin.py",
        "slotwise_tutorialchip/platform.py",
        "slotwise_tutorialchip/graphs.py",
    }


@pytest.mark.slow
def test_the_tutorial_plugin_passes_the_conformance_suite(tmp_path):
    project = tmp_path / "project"
    for name, body in tutorial_files().items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(body)
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(project),
        ],
        check=True,
        capture_output=True,
    )
    env = clean_env(TUTORIALCHIP_VISIBLE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "conformance", "tutorialchip"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("PASSED")
    results = dict(re.findall(r"^(\w+)\s+(passed|failed|skipped)\b", result.stdout, re.M))
    for check in ("interface", "probe", "attention", "compile", "static_graphs", "communicator"):
        assert results[check] == "passed", result.stdout
