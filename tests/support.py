"""Test helpers: throwaway plugin distributions and clean subprocess environments."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without any SLOTWISE_* variable, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTWISE_")}
    env.update(overrides)
    return env


@dataclass
class Distributions:
    """A folder on sys.path holding real ``*.dist-info`` distributions.

    importlib.metadata finds their entry points exactly as it finds installed
    packages, so plugin discovery is exercised end to end.
    """

    root: Path

    def add(
        self,
        dist_name: str,
        module_source: str,
        *,
        entry_point: str | None = None,
        version: str = "1.0",
    ) -> str:
        module = dist_name.replace("-", "_")
        (self.root / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = self.root / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text(
            f"[slotwise.plugins]\n{entry_point or module} = {module}\n"
        )
        return module

    def run(self, code: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a fresh interpreter that sees these distributions."""
        environ = clean_env(**env)
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.root), environ.get("PYTHONPATH", "")) if p
        )
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
