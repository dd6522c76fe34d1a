"""examples/generate.py: greedy tokens from the compiled model equal the eager ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import clean_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generate.py"


def test_generate_example_matches_eager():
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--prompt",
            "3,1,4,1,5",
            "--max-new-tokens",
            "4",
            "-O.backend=eager",
            "--check",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=clean_env(SLOTWISE_DISABLE_COMPILE_CACHE="1"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["matches_eager"] is True
    assert len(report["tokens"][0]) == 4
