"""The one rule for graph modes: what a platform and attention backend support, and
which mode a model runs with (each step's graphs: test_graph_dispatcher.py)."""

from __future__ import annotations

import logging
import re

import pytest
from graph_test_platforms import BOTH, FULL, NONE, PIECEWISE, Graphs, NoGraphs, backend

from slotwise.attention.backend import GraphSupport
from slotwise.compilation import CompilationConfig, CompilationLevel, ConfigError
from slotwise.compilation.compiled_forward import prepare_config
from slotwise.compilation.platform_defaults import apply_platform_defaults
from slotwise.compilation.static_graphs.graph_modes import (
    attention_backends_of,
    check_graph_mode_level,
    default_graph_mode,
    require_graph_mode,
    settle_graph_mode,
    sizes_padding_never_reaches,
    supported_graph_modes,
)


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


def test_a_model_is_judged_by_the_backends_of_all_its_attention_layers():
    import torch

    from slotwise.attention import Attention, AttentionBackend, AttentionImpl

    def attention_backend(support: GraphSupport) -> type[AttentionBackend]:
        class Backend(AttentionBackend):
            graph_support = support

            @classmethod
            def get_name(cls) -> str:
                return f"{support.name}_BACKEND"

            @classmethod
            def get_impl_cls(cls) -> type[AttentionImpl]:
                return AttentionImpl

        return Backend

    def layer(name: str, backend_cls: type[AttentionBackend]) -> Attention:
        return Attention(2, 16, 0.25, prefix=f"test_graph_modes.{name}", backend=backend_cls)

    uniform, piecewise = attention_backend(UNIFORM), attention_backend(PIECEWISE_ONLY)
    model = torch.nn.Sequential(
        layer("a", uniform),
        layer("b", piecewise),
        layer("c", uniform),
    )
    backends = attention_backends_of(model)
    assert backends == [uniform, piecewise]
    choice = default_graph_mode(Graphs(), backends)
    assert choice.mode == PIECEWISE
    assert "PIECEWISE_ONLY_BACKEND has graph_support PIECEWISE_ONLY" in choice.reason
    assert attention_backends_of(torch.nn.Linear(2, 2)) == []


@pytest.fixture
def settled(caplog):
    """``settled(platform, supports, **fields)``: a level-3 config with ``fields`` settled
    for a model whose attention backends have ``supports``, and the records it logged."""

    def settle(platform, supports, **fields):
        config = CompilationConfig(level=3, **fields)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="slotwise"):
            settle_graph_mode(config, platform, [backend(support) for support in supports])
        return config, list(caplog.records)

    return settle


@pytest.mark.parametrize(
    "requested, supports, expected, why",
    [
        (PIECEWISE, [ALWAYS], NONE, "no piecewise graph can leave attention out"),
        (PIECEWISE, [PIECEWISE_ONLY], NONE, "graph_mode=FULL captures the whole model"),
        (BOTH, [ALWAYS], FULL, "full graphs of the whole model \\(FULL\\) capture every batch"),
        (BOTH, [UNIFORM], NONE, "cannot hold attention backend UNIFORM_DECODE_BACKEND, whose"),
        (BOTH, [ALWAYS, PIECEWISE_ONLY], NONE, "backend PIECEWISE_ONLY_BACKEND, whose graph_s"),
        (BOTH, [], FULL, "capture every batch instead"),  # a model without attention
    ],
)
def test_nothing_split_means_no_piecewise_graphs_with_one_warning(
    settled, requested, supports, expected, why
):
    config, records = settled(Graphs(), supports, graph_mode=requested, splitting_ops=[])
    assert config.graph_mode == expected
    (record,) = records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(f"graph_mode={requested.name} turned to {expected.name}: ")
    assert "splitting_ops is []" in message and re.search(why, message), message


@pytest.mark.parametrize("requested", [NONE, FULL])
def test_nothing_split_keeps_modes_without_pieces_silently(settled, requested):
    config, records = settled(Graphs(), [ALWAYS], graph_mode=requested, splitting_ops=[])
    assert config.graph_mode == requested and records == []


@pytest.mark.parametrize(
    "supports, mode", [([ALWAYS], FULL), ([UNIFORM], NONE), ([PIECEWISE_ONLY], NONE)]
)
def test_the_default_without_a_split_is_full_where_attention_allows_it(settled, supports, mode):
    config, records = settled(Graphs(), supports, splitting_ops=[])
    assert config.graph_mode == mode
    (record,) = records
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(f"graph_mode {mode.name} by default: splitting_ops is []")


def test_inductor_partition_without_splitting_ops_splits_nothing_either(settled):
    config, _ = settled(
        Graphs(),
        [UNIFORM],
        graph_mode=PIECEWISE,
        splitting_ops=[],
        backend="inductor",
        use_inductor_graph_partition=True,
    )
    assert config.graph_mode == NONE


@pytest.mark.parametrize("level", [0, 1, 2])
def test_levels_below_three_keep_their_split_rules_out_of_it(level):
    """Only level 3 splits; below it splitting_ops=[] changes nothing (and FULL at level 2
    is the whole traced model's graph)."""
    config = CompilationConfig(level=level, splitting_ops=[], graph_mode=NONE)
    settle_graph_mode(config, Graphs(), [backend(ALWAYS)])
    assert config.graph_mode == NONE
    if level == 2:
        config = CompilationConfig(level=2, splitting_ops=[], graph_mode=FULL)
        settle_graph_mode(config, Graphs(), [backend(ALWAYS)])
        assert config.graph_mode == FULL


@pytest.mark.parametrize(
    "level, mode, fix",
    [
        (
            0,
            FULL,
            "level 2 or 3, but level is 0 \\(NO_COMPILATION\\); set level=3 or graph_mode=NONE",
        ),
        (0, PIECEWISE, "need level 3 \\(PIECEWISE\\), but level is 0 .*graph_mode=NONE"),
        (
            1,
            FULL,
            "need level 2 or 3, but level is 1 \\(DYNAMO_AS_IS\\); set level=3 or graph_mode=NONE",
        ),
        (1, BOTH, "need level 3 \\(PIECEWISE\\), but level is 1"),
        (2, PIECEWISE, "level is 2 \\(DYNAMO_ONCE\\); set level=3 or graph_mode=FULL or NONE"),
        (2, BOTH, "level is 2 \\(DYNAMO_ONCE\\); set level=3 or graph_mode=FULL or NONE"),
    ],
)
def test_a_graph_mode_the_level_cannot_capture_is_one_config_error(level, mode, fix):
    config = CompilationConfig(level=level, graph_mode=mode)
    with pytest.raises(
        ConfigError, match=f"^compilation config key 'graph_mode': {mode.name} .*{fix}"
    ):
        check_graph_mode_level(config)
    with pytest.raises(ConfigError, match=fix):
        settle_graph_mode(config, Graphs(), [backend(ALWAYS)])


@pytest.mark.parametrize(
    "level, mode", [(0, NONE), (1, NONE), (2, FULL), (3, PIECEWISE), (3, BOTH)]
)
def test_graph_modes_each_level_captures_pass(level, mode):
    check_graph_mode_level(CompilationConfig(level=level, graph_mode=mode))
    check_graph_mode_level(CompilationConfig(level=level))


@pytest.mark.parametrize(
    "sizes, setting",
    [
        ({"capture_sizes": []}, "capture_sizes=\\[\\], max_capture_size=0"),
        ({"max_capture_size": 0}, "capture_sizes=\\[\\], max_capture_size=0"),
        ({"capture_sizes": [], "max_capture_size": 64}, "capture_sizes=\\[\\]"),
    ],
)
@pytest.mark.parametrize("mode", [PIECEWISE, FULL, BOTH])
def test_an_explicit_graph_mode_with_nothing_to_capture_is_refused(settled, sizes, setting, mode):
    with pytest.raises(
        ConfigError, match=f"'capture_sizes': graph_mode {mode.name} .*none \\({setting}\\); give"
    ):
        settled(Graphs(), [ALWAYS], graph_mode=mode, **sizes)


@pytest.mark.parametrize("sizes", [{"capture_sizes": []}, {"max_capture_size": 0}])
def test_the_default_with_nothing_to_capture_is_none_and_says_why(settled, sizes):
    config, records = settled(Graphs(), [ALWAYS], **sizes)
    assert config.graph_mode == NONE
    (record,) = records
    assert record.getMessage().startswith(
        "graph_mode NONE by default: there is nothing to capture ("
    )


def test_nothing_to_capture_is_no_error_where_nothing_would_be_captured(settled):
    config, records = settled(NoGraphs(), [ALWAYS], graph_mode=PIECEWISE, capture_sizes=[])
    assert config.graph_mode == NONE
    assert [r.levelno for r in records] == [logging.WARNING]  # no GraphAPI, said once
    assert settled(Graphs(), [ALWAYS], graph_mode=NONE, capture_sizes=[])[0].graph_mode == NONE


def test_a_model_that_runs_uncompiled_captures_nothing():
    config = CompilationConfig(level=3, graph_mode=BOTH)
    settle_graph_mode(config, Graphs(), [backend(ALWAYS)], compiled=False)
    assert config.graph_mode == NONE


@pytest.mark.parametrize(
    "fields, unreached",
    [
        (
            {"graph_mode": PIECEWISE, "capture_sizes": [1, 2, 4, 8], "compile_sizes": [3, 4, 8, 9]},
            [3],
        ),
        ({"graph_mode": BOTH, "capture_sizes": [2, 8], "compile_sizes": [1, 5, 16]}, [1, 5]),
        ({"graph_mode": NONE, "capture_sizes": [2, 8], "compile_sizes": [1, 5]}, []),
    ],
)
def test_compile_sizes_padding_never_reaches(fields, unreached):
    assert sizes_padding_never_reaches(CompilationConfig(level=3, **fields)) == unreached


def test_each_graph_mode_change_is_logged_once_through_prepare_config(caplog):
    """The rule's warning is the one record of the change: the platform-change log of
    prepare_config does not repeat it."""
    config = CompilationConfig(level=3, graph_mode=PIECEWISE, splitting_ops=[])
    with caplog.at_level(logging.DEBUG, logger="slotwise"):
        adapted = prepare_config(config, SelectsBackend(ALWAYS))
    assert adapted.graph_mode == NONE
    about_mode = [r for r in caplog.records if "graph_mode" in r.getMessage()]
    assert len(about_mode) == 1 and about_mode[0].levelno == logging.WARNING
