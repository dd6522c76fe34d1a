"""Shared fixtures; the helpers they use live in support.py (importable from tests)."""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path

import pytest
from support import Distributions, skip_cuda_tests_without_a_gpu


@pytest.fixture
def dists(tmp_path: Path) -> Distributions:
    root = tmp_path / "site"
    root.mkdir()
    return Distributions(root)


def pytest_configure(config: pytest.Config) -> None:
    """One Inductor cache folder for the whole run, Inductor's own default: otherwise the
    first test compiling with Inductor would move it into its temporary slotwise cache for
    every later test. The tests of that placement unset the variable in their processes."""
    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda_tests_without_a_gpu(items)
