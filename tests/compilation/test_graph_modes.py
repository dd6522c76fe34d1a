"""The one rule for graph modes: what a platform and attention backend support, and
which graphs act in a step."""

from __future__ import annotations

import pytest

from slotwise.attention.backend import GraphSupport
from slotwise.compilation import CompilationConfig, ConfigError, GraphMode
from slotwise.compilation.graph_modes import (
    require_graph_mode,
    step_graph_mode,
    supported_graph_modes,
)
from slotwise.forward_context import BatchDescriptor
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
    class Backend:
        graph_support = support

        @classmethod
        def get_name(cls) -> str:
            return f"{support.name}_BACKEND"

    return Backend


@pytest.mark.parametrize(
    "platform, support, modes",
    [
        (NoGraphs(), GraphSupport.ALWAYS, [NONE]),
        (NoGraphs(), None, [NONE]),
        (Graphs(), None, [NONE, PIECEWISE, FULL, BOTH]),
        (Graphs(), GraphSupport.ALWAYS, [NONE, PIECEWISE, FULL, BOTH]),
        (Graphs(), GraphSupport.UNIFORM_DECODE, [NONE, PIECEWISE, BOTH]),
        (Graphs(), GraphSupport.PIECEWISE_ONLY, [NONE, PIECEWISE]),
    ],
)
def test_supported_graph_modes(platform, support, modes):
    attention = None if support is None else backend(support)
    assert supported_graph_modes(platform, attention) == modes


@pytest.mark.parametrize(
    "platform, support, mode, message",
    [
        (NoGraphs(), GraphSupport.ALWAYS, PIECEWISE, "has no static graphs.*graph_mode=NONE"),
        (Graphs(), GraphSupport.PIECEWISE_ONLY, BOTH, "PIECEWISE_ONLY; use graph_mode=PIECEWISE"),
        (Graphs(), GraphSupport.UNIFORM_DECODE, FULL, "; use graph_mode=FULL_AND_PIECEWISE"),
    ],
)
def test_require_graph_mode_names_the_mode_to_use(platform, support, mode, message):
    with pytest.raises(ConfigError, match=message):
        require_graph_mode(mode, platform, backend(support))
    require_graph_mode(NONE, platform, backend(support))


def config(mode: GraphMode) -> CompilationConfig:
    return CompilationConfig(graph_mode=mode, capture_sizes=[1, 2, 4])


@pytest.mark.parametrize(
    "mode, size, uniform, expected",
    [
        (NONE, 2, True, NONE),
        (PIECEWISE, 2, False, PIECEWISE),
        (PIECEWISE, 3, False, NONE),  # not a capture size
        (PIECEWISE, None, False, NONE),
        (FULL, 4, False, FULL),
        (BOTH, 2, True, FULL),
        (BOTH, 2, False, PIECEWISE),
    ],
)
def test_step_graph_mode_follows_the_config_and_the_batch(mode, size, uniform, expected):
    descriptor = BatchDescriptor(num_tokens=size or 0, uniform_decode=uniform)
    assert step_graph_mode(config(mode), size, descriptor) == expected


@pytest.mark.parametrize(
    "mode, requested, expected",
    [
        (NONE, PIECEWISE, NONE),  # nothing is ever captured with graph_mode NONE
        (NONE, FULL, NONE),
        (PIECEWISE, PIECEWISE, PIECEWISE),
        (PIECEWISE, FULL, NONE),  # no full-model graph to replay
        (PIECEWISE, NONE, NONE),
        (FULL, PIECEWISE, NONE),
        (BOTH, FULL, FULL),
        (BOTH, PIECEWISE, PIECEWISE),
    ],
)
def test_a_requested_mode_is_followed_only_where_the_config_captures(mode, requested, expected):
    # Size 3 is not a capture size: a request overrides the size rule (and the wrapper
    # then raises for it), but never the config's graph mode.
    assert step_graph_mode(config(mode), 3, requested=requested) == expected
