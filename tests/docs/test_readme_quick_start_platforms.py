"""The README's quick start runs on whatever platform slotwise selects: it names no
device and no compiler itself, and it runs as written on the stub NPU too, whose
compiler (eager) and static graphs differ from the CPU's (test_readme_examples.py runs
it on the platform selected here, the CPU, or CUDA on a GPU machine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

ROOT = Path(__file__).resolve().parents[2]


def quick_start() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    return re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)[0]


def test_the_quick_start_names_no_device_and_no_compiler():
    code = quick_start()
    for literal in ('"cpu"', '"cuda"', "'cpu'", "'cuda'", "backend="):
        assert literal not in code
    assert "platform.device_type" in code


@pytest.mark.slow
def test_the_quick_start_runs_on_the_stub_npu(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", quick_start()],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=clean_env(
            SLOTWISE_CACHE_ROOT=str(tmp_path / "cache"),
            SLOTWISE_PLATFORM="ascend_stub",
            SLOTWISE_ASCEND_STUB_DEVICES="1",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[0] == "ascend_stub cpu"
