"""The one rule for graph modes: what a platform and attention backend support, and
which graphs act in a step."""

from __future__ import annotations

import logging
import re

import pytest

from slotwise.attention.backend import GraphSupport
from slotwise.compilation import CompilationConfig, CompilationLevel, ConfigError, GraphMode
from slotwise.compilation.compiled_forward import prepare_config
from slotwise.compilation.platform_defaults import apply_platform_defaults
from slotwise.compilation.static_graphs.graph_modes import (
    attention_backends_of,
    default_graph_mode,
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


class SelectsBackend(Graphs):
    """A graph platform that chooses its attention backend itself, as CUDA's may."""

    name = "selects"

    def __init__(self, support: GraphSupport) -> None:
        super().__init__()
        self.backend = backend(support)

    def get_attention_backend_cls(self, selected=None, **requirements):
        return self.backend


PIECEWISE_ONLY, UNIFORM, ALWAYS = (
    GraphSupport.PIECEWISE_ONLY,
    GraphSupport.UNIFORM_DECODE,
    GraphSupport.ALWAYS,
)


@pytest.mark.parametrize(
    "platform, supports, mode, reason",
    [
        (NoGraphs(), [ALWAYS], NONE, "platform no_graphs has no static graphs"),
        (NoGraphs(), [], NONE, "has no static graphs"),
        (Graphs(), [PIECEWISE_ONLY], PIECEWISE, "PIECEWISE_ONLY_BACKEND has graph_support PIEC"),
        (Graphs(), [UNIFORM], BOTH, "UNIFORM_DECODE_BACKEND \\(UNIFORM_DECODE\\) may be capt"),
        (Graphs(), [ALWAYS], BOTH, "ALWAYS_BACKEND \\(ALWAYS\\) may be captured in full"),
        (Graphs(), [ALWAYS, UNIFORM], BOTH, "ALWAYS_BACKEND \\(ALWAYS\\), UNIFORM_DECODE_B"),
        # One layer whose attention cannot be captured keeps the whole model piecewise.
        (Graphs(), [ALWAYS, PIECEWISE_ONLY], PIECEWISE, "PIECEWISE_ONLY_BACKEND has graph_su"),
        (Graphs(), [], BOTH, "the model has no attention layer"),
    ],
)
def test_default_mode_for_each_graph_api_and_attention_graph_support(
    platform, supports, mode, reason
):
    choice = default_graph_mode(platform, [backend(support) for support in supports])
    assert choice.mode == mode
    assert re.search(reason, choice.reason), choice.reason
    # Whatever the default, it is a mode the runner accepts for each of those backends.
    for support in supports:
        require_graph_mode(choice.mode, platform, backend(support))


@pytest.mark.parametrize(
    "support, mode", [(PIECEWISE_ONLY, PIECEWISE), (UNIFORM, BOTH), (ALWAYS, BOTH)]
)
def test_without_the_models_backends_the_default_follows_the_platforms_selection(support, mode):
    choice = default_graph_mode(SelectsBackend(support))
    assert choice.mode == mode
    assert f"{support.name}_BACKEND" in choice.reason


def test_a_graph_platform_without_a_selectable_backend_defaults_to_piecewise():
    choice = default_graph_mode(Graphs())  # no backend is registered for platform "graphs"
    assert choice.mode == PIECEWISE
    assert "none was selected (no attention backend is registered for platform 'graphs'" in (
        choice.reason
    )


@pytest.mark.parametrize("level", [CompilationLevel.DYNAMO_AS_IS, CompilationLevel.DYNAMO_ONCE])
def test_below_level_three_nothing_is_captured_by_default(level):
    choice = default_graph_mode(SelectsBackend(ALWAYS), level=level)
    assert choice.mode == NONE
    assert f"level {level.value} ({level.name}) captures no graphs" in choice.reason


def test_the_default_is_filled_in_and_logged_with_its_reason(caplog):
    config = CompilationConfig(level=3)
    with caplog.at_level(logging.INFO, logger="slotwise"):
        apply_platform_defaults(Graphs(), config, [backend(UNIFORM)])
    assert config.graph_mode == BOTH
    assert any(
        record.getMessage().startswith("graph_mode FULL_AND_PIECEWISE by default: platform graphs")
        for record in caplog.records
    )


@pytest.mark.parametrize("explicit", [NONE, PIECEWISE, FULL])
def test_an_explicit_graph_mode_wins_over_the_default(explicit):
    config = CompilationConfig(level=3, graph_mode=explicit)
    assert prepare_config(config, SelectsBackend(ALWAYS)).graph_mode == explicit


def test_ascend_stub_defaults_to_full_and_piecewise_for_its_reference_backend():
    from slotwise_ascend_stub.platform import AscendStubPlatform

    platform = AscendStubPlatform()
    choice = default_graph_mode(platform)
    assert choice.mode == BOTH
    assert "attention backend ASCEND_STUB_REFERENCE (UNIFORM_DECODE) may be captured" in (
        choice.reason
    )
    assert prepare_config(CompilationConfig(level=3), platform).graph_mode == BOTH


def test_a_model_is_judged_by_the_backends_of_all_its_attention_layers():
    import torch

    from slotwise.attention import Attention
    from slotwise_ascend_stub.attention import AscendStubReferenceBackend
    from slotwise_cpu.attention import CpuSdpaBackend

    def layer(name: str, attention_backend: type) -> Attention:
        return Attention(2, 16, 0.25, prefix=f"test_graph_modes.{name}", backend=attention_backend)

    model = torch.nn.Sequential(
        layer("a", AscendStubReferenceBackend),
        layer("b", CpuSdpaBackend),
        layer("c", AscendStubReferenceBackend),
    )
    backends = attention_backends_of(model)
    assert backends == [AscendStubReferenceBackend, CpuSdpaBackend]
    choice = default_graph_mode(Graphs(), backends)
    assert choice.mode == PIECEWISE and "CPU_SDPA has graph_support PIECEWISE_ONLY" in choice.reason
    assert attention_backends_of(torch.nn.Linear(2, 2)) == []
