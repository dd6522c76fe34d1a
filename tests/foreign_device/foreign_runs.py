"""Running code, commands and workers on the "foreign" test device, in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support import process_env

#: Devices the runtime reports (its FOREIGN_DEVICES), two so that each of two
#: tensor-parallel ranks claims its own.
DEVICES = "2"
#: foreign_worker.py: the engine's runs on the device, one JSON object each.
WORKER = Path(__file__).with_name("foreign_worker.py")


def foreign_overrides(site: Path) -> dict[str, str]:
    """The variables that select the foreign platform from the distributions in ``site``."""
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
        "FOREIGN_DEVICES": DEVICES,
        "SLOTWISE_PLATFORM": "foreign",
        "SLOTWISE_STRICT_PLUGINS": "1",
        "SLOTWISE_DISABLE_COMPILE_CACHE": "1",
    }


def foreign_env(site: Path, **overrides: str) -> dict[str, str]:
    """A process environment (``support.process_env``) selecting the foreign platform."""
    return process_env(**{**foreign_overrides(site), **overrides})


def run(
    site: Path, argv: list[str], timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=foreign_env(site, **env), capture_output=True, text=True, timeout=timeout
    )


def run_python(
    site: Path, code: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in ``foreign_env(site, **env)``."""
    return run(site, [sys.executable, "-c", textwrap.dedent(code)], timeout, **env)


def run_slotwise(
    site: Path, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """``slotwise ARGS`` in a fresh process in ``foreign_env(site, **env)``."""
    return run(site, [sys.executable, "-m", "slotwise", *args], timeout, **env)


def run_worker(site: Path, *args: str, timeout: float = 300) -> dict:
    """``foreign_worker.py ARGS`` in a fresh process: the JSON object it prints."""
    result = run(site, [sys.executable, str(WORKER), *args], timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return last_json(result.stdout)


def last_json(stdout: str) -> dict:
    """The JSON object on the last line of ``stdout``."""
    return json.loads(stdout.strip().splitlines()[-1])
