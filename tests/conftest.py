"""Shared fixtures; the helpers they use live in support.py (importable from tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    Distributions,
    command_logging_left_as_found,
    keep_inductors_default_cache_folder,
    skip_cuda_tests_without_a_gpu,
)


@pytest.fixture
def dists(tmp_path: Path) -> Distributions:
    root = tmp_path / "site"
    root.mkdir()
    return Distributions(root)


@pytest.fixture(autouse=True)
def _command_logging_left_as_found() -> Iterator[None]:
    with command_logging_left_as_found():
        yield


def pytest_configure(config: pytest.Config) -> None:
    keep_inductors_default_cache_folder()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda_tests_without_a_gpu(items)
