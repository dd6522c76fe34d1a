"""Running the conformance suite in a subprocess, as a vendor's CI would, for these tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import clean_env

#: The whole suite takes 10-25 s on 2 cores; this only guards against a hang.
TIMEOUT_S = 300


def environment(site: Path | None = None, **env: str) -> dict[str, str]:
    """A clean environment, seeing the throwaway distributions in ``site`` if given."""
    environ = clean_env(**env)
    if site is not None:
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(site), environ.get("PYTHONPATH", "")) if p
        )
    return environ


def run_cli(
    platform: str,
    *pytest_args: str,
    site: Path | None = None,
    require_all: bool = False,
    time_limit: str | None = None,
    **env: str,
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``slotwise conformance PLATFORM --json [--require-all] [--timeout S] --
    PYTEST_ARGS``: its JSON summary and process."""
    flags = ["--json", *(["--require-all"] if require_all else [])]
    flags += ["--timeout", time_limit] if time_limit is not None else []
    result = subprocess.run(
        [sys.executable, "-m", "slotwise", "conformance", platform, *flags, "--", *pytest_args],
        env=environment(site, **env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    try:
        summary = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON summary; stderr:\n{result.stderr[-5000:]}") from None
    return summary, result


def outcomes(summary: dict[str, Any]) -> dict[str, str]:
    """Each check's outcome, by check name."""
    return {check["check"]: check["outcome"] for check in summary["checks"]}


def messages(summary: dict[str, Any], check: str) -> str:
    """The messages of the tests of ``check`` that did not pass, one per line."""
    tests = next(c["tests"] for c in summary["checks"] if c["check"] == check)
    return "\n".join(t["message"] for t in tests if t["outcome"] != "passed")
