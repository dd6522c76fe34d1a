"""The engine's tests, runnable alone (``pytest`` in engine/) or with the core's."""

from __future__ import annotations

import getpass
import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Inductor keeps its default cache folder for the whole run, as in the core's tests,
    instead of the slotwise cache of whichever test first compiles with it."""
    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default)
