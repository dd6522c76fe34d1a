"""``GraphMode``: which static graphs (CUDA graphs, NPU graphs) a config captures and a
step replays.

Its own module below the compilation package: the compilation config holds a mode as a
setting, and the forward context, which attention ops read, carries a step's mode
without importing compilation.
"""

from __future__ import annotations

import enum

from slotwise.config_error import rejected


class GraphMode(enum.Enum):
    """Which static graphs (CUDA graphs, NPU graphs) a platform captures and replays."""

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"

    @property
    def has_full_graphs(self) -> bool:
        return self in (GraphMode.FULL, GraphMode.FULL_AND_PIECEWISE)

    @property
    def has_piecewise_graphs(self) -> bool:
        return self in (GraphMode.PIECEWISE, GraphMode.FULL_AND_PIECEWISE)

    @property
    def is_runtime_mode(self) -> bool:
        """One forward pass replays one kind of graph; FULL_AND_PIECEWISE only names a config."""
        return self is not GraphMode.FULL_AND_PIECEWISE

    @classmethod
    def runtime_modes(cls) -> tuple[GraphMode, ...]:
        return tuple(mode for mode in cls if mode.is_runtime_mode)

    @classmethod
    def parse(cls, value: object) -> GraphMode:
        """Accept a member or its name in any case."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.strip().upper() in cls.__members__:
            return cls[value.strip().upper()]
        names = ", ".join(cls.__members__)
        raise rejected("graph_mode", value, f"{names} (any case); null lets the platform choose")
