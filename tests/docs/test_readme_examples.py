"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text(), re.M | re.S)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index, tmp_path):
    block = python_blocks()[index]
    result = subprocess.run(
        [sys.executable, "-c", block],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=clean_env(SLOTWISE_CACHE_ROOT=str(tmp_path / "cache")),
    )
    assert result.returncode == 0, result.stderr[-3000:]
