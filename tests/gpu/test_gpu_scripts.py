"""The GPU check script and benchmark refuse clearly where there is no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import clean_env

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_names_the_platform_it_needs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_decode.py")],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert result.returncode != 0
    assert "gpu_decode needs the cuda platform, not cpu" in result.stderr


def test_gpu_check_script_is_valid_bash():
    script = ROOT / "tests" / "gpu" / "run_gpu_checks.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
