"""Platforms with and without static graphs, and attention backends of each graph
support, for the graph-mode and dispatcher tests: the decisions depend on nothing else."""

from __future__ import annotations

from slotwise.attention.backend import GraphSupport
from slotwise.compilation import GraphMode
from slotwise.platforms import Platform

NONE, PIECEWISE, FULL, BOTH = (
    GraphMode.NONE,
    GraphMode.PIECEWISE,
    GraphMode.FULL,
    GraphMode.FULL_AND_PIECEWISE,
)


class NoGraphs(Platform):
    name = "no_graphs"
    device_type = "cpu"


class Graphs(NoGraphs):
    name = "graphs"

    def get_graph_api(self, **kwargs):
        return object()


def backend(support: GraphSupport) -> type:
    """An attention backend class that declares ``support`` and nothing else."""

    class Backend:
        graph_support = support

        @classmethod
        def get_name(cls) -> str:
            return f"{support.name}_BACKEND"

    return Backend
