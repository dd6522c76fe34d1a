"""Shared fixtures; the helpers they use live in support.py (importable from tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import Distributions


@pytest.fixture
def dists(tmp_path: Path) -> Distributions:
    root = tmp_path / "site"
    root.mkdir()
    return Distributions(root)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``cuda`` where no NVIDIA GPU is usable."""
    if not any(item.get_closest_marker("cuda") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)
