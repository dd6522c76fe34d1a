"""slotwise's static-graph wrappers on the CPU, through the core's recorded graphs.

``RecordedGraphAPI`` keeps the contract of a device graph: a replay runs again the ops
its capture recorded, on the captured tensors, with the host values of the capture, and
writes into the captured outputs, so a test sees exactly what a real graph does: new
data in a captured buffer is picked up, a new tensor elsewhere is not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from slotwise.compilation.static_graphs.recorded_graph import RecordedGraphAPI
from slotwise.platforms import Platform, use_platform


class RecordedGraphPlatform(Platform):
    """A graph platform on the CPU whose graphs are the core's recorded graphs."""

    name = "recorded_graphs"
    device_type = "cpu"
    default_compile_backend = "eager"

    def __init__(self, api: RecordedGraphAPI) -> None:
        super().__init__()
        self.api = api

    def get_graph_api(self, **kwargs: Any) -> RecordedGraphAPI:
        return self.api

    def synchronize(self, **kwargs: Any) -> None:
        return None


@pytest.fixture
def graph_api() -> Iterator[RecordedGraphAPI]:
    """A fresh ``RecordedGraphAPI``, the graph API of the current platform for the test."""
    api = RecordedGraphAPI()
    with use_platform(RecordedGraphPlatform(api)):
        yield api
