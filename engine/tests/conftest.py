"""The engine's tests, runnable alone (``pytest`` in engine/) or with the core's."""

from __future__ import annotations

import pytest
from support import keep_inductors_default_cache_folder, skip_cuda_tests_without_a_gpu


def pytest_configure(config: pytest.Config) -> None:
    keep_inductors_default_cache_folder()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda_tests_without_a_gpu(items)
