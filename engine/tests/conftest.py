"""The engine's tests, runnable alone (``pytest`` in engine/) or with the core's."""

from __future__ import annotations

import getpass
import os
import tempfile

import pytest
from support import skip_cuda_tests_without_a_gpu


def pytest_configure(config: pytest.Config) -> None:
    """Inductor keeps its default cache folder for the whole run, as in the core's tests,
    instead of the slotwise cache of whichever test first compiles with it."""
    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda_tests_without_a_gpu(items)
