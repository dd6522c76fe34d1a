"""Levels 0-3 and the decorators, with the eager compiler and exact counters."""

from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo.utils
from torch import nn

import slotwise
from slotwise.compilation import (
    CompilationConfig,
    ConfigError,
    compiled_forward_of,
    counters,
    ignore_torch_compile,
    set_compilation_config,
    support_torch_compile,
)
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel, ToyTransformer, attend


def eager_config(**changes) -> CompilationConfig:
    fields = {"level": 3, "backend": "eager", "splitting_ops": TOY_SPLITTING_OPS}
    fields.update(changes)
    return CompilationConfig(**fields)


def twin(cls, config, *args):
    """``cls`` compiled with ``config`` and an uncompiled copy with the same weights."""
    torch.manual_seed(0)
    compiled = cls(*args, compilation_config=config)
    torch.manual_seed(0)
    reference = cls(*args, compilation_config=CompilationConfig(level=0))
    return compiled, reference


def test_two_splitting_ops_give_five_pieces_three_compiled():
    model, reference = twin(SillyModel, eager_config(compile_sizes=[4, 8]))
    x = torch.randn(3, 8)
    with counters.expect(
        num_models_seen=1,
        num_graphs_seen=1,
        num_piecewise_graphs_seen=5,
        num_piecewise_capturable_graphs_seen=3,
        num_backend_compilations=3,
        num_eager_compiles=3,
        num_graphs_captured=0,
    ):
        torch.testing.assert_close(model(x), reference(x))
    for size in (4, 8):
        x = torch.randn(size, 8)
        with counters.expect(num_graphs_seen=0, num_backend_compilations=3):
            torch.testing.assert_close(model(x), reference(x))
        with counters.expect(num_backend_compilations=0):  # compiled once per size
            torch.testing.assert_close(model(x), reference(x))


def test_traced_once_no_recompile_for_twenty_sizes_including_zero_and_one():
    model, reference = twin(SillyModel, eager_config())
    model(torch.randn(5, 8))
    torch._dynamo.utils.counters.clear()
    with counters.expect(num_graphs_seen=0, num_models_seen=0, num_backend_compilations=0):
        for size in [0, 1, *range(2, 20)]:
            x = torch.randn(size, 8)
            torch.testing.assert_close(model(x), reference(x))
    assert not torch._dynamo.utils.counters["recompiles"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0


@pytest.mark.parametrize("first_size", [0, 1])
def test_a_first_call_of_size_zero_or_one_still_traces_a_general_graph(first_size):
    model, reference = twin(SillyModel, eager_config(compile_sizes=[4]))
    model(torch.randn(first_size, 8))
    # A graph specialised to the first size would have no dynamic size to dispatch on.
    with counters.expect(num_graphs_seen=0, num_backend_compilations=3):
        for size in (4, 7, 1, 0):
            x = torch.randn(size, 8)
            torch.testing.assert_close(model(x), reference(x))


@pytest.mark.parametrize("layers", [1, 12])
def test_toy_transformer_splits_into_two_l_plus_one_pieces(layers):
    model, reference = twin(ToyTransformer, eager_config(), layers)
    ids = torch.randint(0, 64, (7,))
    with counters.expect(
        num_piecewise_graphs_seen=2 * layers + 1,
        num_piecewise_capturable_graphs_seen=layers + 1,
        num_backend_compilations=layers + 1,
    ):
        torch.testing.assert_close(model(ids), reference(ids))


@pytest.mark.parametrize("splitting_ops", [[], None])
def test_no_split_when_no_splitting_op_is_in_the_graph(splitting_ops):
    # [] asks for no split; None means the default attention ops, absent from this model.
    model, reference = twin(ToyTransformer, eager_config(splitting_ops=splitting_ops), 3)
    ids = torch.randint(0, 64, (5,))
    with counters.expect(
        num_piecewise_graphs_seen=1,
        num_piecewise_capturable_graphs_seen=1,
        num_backend_compilations=1,
    ):
        torch.testing.assert_close(model(ids), reference(ids))


class TwoStage(nn.Module):
    """Plain parent of two separately decorated models."""

    def __init__(self) -> None:
        super().__init__()
        self.first = ToyTransformer(1, compilation_config=eager_config())
        self.second = ToyTransformer(1, compilation_config=eager_config())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(ids).argmax(-1))


def test_separately_decorated_submodules_compile_on_their_own():
    with counters.expect(num_models_seen=0):
        model = TwoStage()
    with counters.expect(
        num_models_seen=2,
        num_graphs_seen=2,
        num_piecewise_graphs_seen=6,
        num_piecewise_capturable_graphs_seen=4,
    ):
        model(torch.randint(0, 64, (4,)))


@support_torch_compile
class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = SillyModel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + attend(x, x, x)


def test_decorated_module_inside_a_compiled_parent_is_inlined():
    model, reference = twin(Outer, eager_config())
    x = torch.randn(3, 8)
    # One graph for the parent; the inner model's 2 split points are inlined into it.
    with counters.expect(num_models_seen=1, num_graphs_seen=1, num_piecewise_graphs_seen=7):
        torch.testing.assert_close(model(x), reference(x))


def test_enable_if_on_outer_leaves_inner_compiling_alone():
    @support_torch_compile(enable_if=lambda config: False)
    class DisabledOuter(Outer):
        pass

    model, reference = twin(DisabledOuter, eager_config())
    x = torch.randn(3, 8)
    with counters.expect(num_models_seen=1, num_graphs_seen=1, num_piecewise_graphs_seen=5):
        torch.testing.assert_close(model(x), reference(x))


def test_enable_if_receives_the_config_and_can_disable_the_inner_model():
    seen = []

    @support_torch_compile(enable_if=lambda config: seen.append(config.level) or False)
    class DisabledSilly(SillyModel):
        pass

    model, reference = twin(DisabledSilly, eager_config())
    with counters.expect(num_models_seen=0, num_graphs_seen=0):
        torch.testing.assert_close(model(torch.ones(2, 8)), reference(torch.ones(2, 8)))
    assert seen[0] == 3


def test_ignore_torch_compile_on_a_subclass_and_decorating_again():
    @ignore_torch_compile
    class Ignored(SillyModel):
        pass

    @support_torch_compile
    class Again(Ignored):
        pass

    x = torch.randn(2, 8)
    with counters.expect(num_models_seen=0, num_graphs_seen=0):
        Ignored(compilation_config=eager_config())(x)
    with counters.expect(num_models_seen=1, num_graphs_seen=1):
        Again(compilation_config=eager_config())(x)


def test_level_zero_leaves_every_counter_alone():
    before = counters.snapshot()
    model, reference = twin(SillyModel, CompilationConfig(level=0))
    torch.testing.assert_close(model(torch.ones(3, 8)), reference(torch.ones(3, 8)))
    assert counters.snapshot() == before


def test_level_one_is_plain_torch_compile_without_splitting():
    model, reference = twin(SillyModel, eager_config(level=1))
    x = torch.randn(3, 8)
    with counters.expect(
        num_models_seen=1,
        num_graphs_seen=1,
        num_piecewise_graphs_seen=0,
        num_backend_compilations=0,
    ):
        torch.testing.assert_close(model(x), reference(x))


def test_level_two_compiles_the_whole_graph_once():
    model, reference = twin(SillyModel, eager_config(level=2, compile_sizes=[2]))
    with counters.expect(
        num_graphs_seen=1, num_piecewise_graphs_seen=0, num_backend_compilations=1
    ):
        torch.testing.assert_close(model(torch.ones(3, 8)), reference(torch.ones(3, 8)))
    with counters.expect(num_graphs_seen=0, num_backend_compilations=1):
        torch.testing.assert_close(model(torch.ones(2, 8)), reference(torch.ones(2, 8)))


def test_two_instances_of_one_class_are_traced_separately():
    first = SillyModel(compilation_config=eager_config())
    second = SillyModel(compilation_config=eager_config())
    x = torch.randn(2, 8)
    with counters.expect(num_graphs_seen=2):
        out_first, out_second = first(x), second(x)
    torch.testing.assert_close(out_first, SillyModel.forward.__wrapped__(first, x))
    torch.testing.assert_close(out_second, SillyModel.forward.__wrapped__(second, x))
    assert not torch.allclose(out_first, out_second)


def test_set_compilation_config_is_the_default_for_models_built_inside():
    with set_compilation_config({"level": 0}):
        model = SillyModel()
    with counters.expect(num_models_seen=0):
        model(torch.ones(1, 8))
    with set_compilation_config(eager_config()):
        model = SillyModel()
    with counters.expect(num_models_seen=1):
        model(torch.ones(1, 8))


def test_compilation_config_keyword_whether_or_not_init_declares_it():
    @support_torch_compile
    class Declares(nn.Module):
        def __init__(self, *, compilation_config=None) -> None:
            super().__init__()
            self.seen = compilation_config

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    model = Declares(compilation_config=eager_config(level=0))
    assert model.seen.level == 0
    SillyModel(8, compilation_config={"level": 0})


def test_dynamic_arg_dims_are_inferred_from_tensor_annotations_or_rejected():
    class Unannotated(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="dynamic_arg_dims"):
        support_torch_compile(Unannotated)
    with pytest.raises(ValueError, match=r"\['y'\].*arguments are \['x'\]"):
        support_torch_compile(dynamic_arg_dims={"y": 0})(Unannotated)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        support_torch_compile(object)


def test_slotwise_compile_is_the_functional_form():
    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return attend(x, x, x) * 3

    model = Plain()
    with counters.expect(num_models_seen=1, num_piecewise_graphs_seen=3):
        assert slotwise.compile(model, eager_config()) is model
        out = model(torch.ones(4, 2))
    torch.testing.assert_close(out, Plain()(torch.ones(4, 2)))


def test_both_ways_of_compiling_answer_the_same_accessor():
    """The runner finds a model's compilation through compiled_forward_of, whichever way
    the model was compiled; a model left uncompiled answers None."""

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return attend(x, x, x)

    decorated = SillyModel(compilation_config=eager_config())
    functional = slotwise.compile(Plain(), eager_config())
    for model in (decorated, functional):
        compiled = compiled_forward_of(model)
        assert compiled is not None and compiled.config.level == 3
    assert compiled_forward_of(functional) is functional.forward
    assert compiled_forward_of(slotwise.compile(Plain(), eager_config(level=0))) is None
    assert compiled_forward_of(SillyModel(compilation_config=eager_config(level=0))) is None


def test_cpu_turns_a_requested_graph_mode_off_with_one_warning(caplog):
    with caplog.at_level(logging.INFO, logger="slotwise"):
        model = SillyModel(compilation_config=eager_config(graph_mode="PIECEWISE"))
    assert compiled_forward_of(model).config.graph_mode.name == "NONE"
    about_mode = [r for r in caplog.records if "graph_mode" in r.getMessage()]
    assert len(about_mode) == 1 and about_mode[0].levelno == logging.WARNING
    assert about_mode[0].getMessage().startswith("graph_mode=PIECEWISE turned to NONE: platform")


def test_graph_mode_contradicting_the_level_is_a_config_error():
    with pytest.raises(ConfigError, match="level=3"):
        SillyModel(compilation_config=eager_config(level=2, graph_mode="PIECEWISE"))


@pytest.mark.parametrize("level", [0, 1])
@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE", "FULL_AND_PIECEWISE"])
def test_graph_modes_below_level_two_are_refused_whichever_way_a_model_is_compiled(level, mode):
    """Level 0 runs the module's own forward and level 1 is plain torch.compile: neither
    has graphs to capture, so a graph mode there is an error naming what to set, not a
    setting ignored."""

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    config = eager_config(level=level, graph_mode=mode)
    fix = f"but level is {level} .*; set level=3 or graph_mode=NONE"
    with pytest.raises(ConfigError, match=f"'graph_mode': {mode} graphs .*{fix}"):
        SillyModel(compilation_config=config)
    with pytest.raises(ConfigError, match=fix):
        slotwise.compile(Plain(), config)
    SillyModel(compilation_config=eager_config(level=level, graph_mode="NONE"))


@pytest.mark.parametrize("level", [1, 2, 3])
def test_torch_compile_disable_runs_every_level_eagerly_with_one_warning(level, caplog):
    """As torch.compile itself does under TORCH_COMPILE_DISABLE=1 (Dynamo's config.disable
    is where torch keeps that variable): no trace, no compile, no graph, the same result."""
    import torch._dynamo.config

    with torch._dynamo.config.patch(disable=True):
        with caplog.at_level(logging.INFO, logger="slotwise"):
            model, reference = twin(SillyModel, eager_config(level=level, compile_sizes=[3]))
        config = compiled_forward_of(model).config
        assert config.level == level and config.graph_mode.name == "NONE"
        (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
        expected = f"runs eagerly instead of at compilation level {level}"
        assert warning.getMessage().startswith(f"TORCH_COMPILE_DISABLE=1: SillyModel {expected}")
        before = counters.snapshot()
        for size in (3, 5):
            x = torch.randn(size, 8)
            torch.testing.assert_close(model(x), reference(x))
        assert counters.snapshot() == before


def test_slotwise_error_inside_the_backend_reaches_the_caller_as_itself(monkeypatch):
    """A slotwise error raised while Dynamo runs the backend (a full disk, say) names the
    problem and the fix: the caller gets it, not Dynamo's BackendCompilerFailed wrapping."""
    from slotwise.compilation.cache.inductor_cache_dir import CacheDiskFullError
    from slotwise.compilation.splitting.dynamo_backends import TraceOnceBackend

    def full(self, graph, example_inputs):
        raise CacheDiskFullError("no room for compiled kernels in /full; free space in /full")

    monkeypatch.setattr(TraceOnceBackend, "build", full)
    model = SillyModel(compilation_config=eager_config())
    with pytest.raises(CacheDiskFullError, match="no room for compiled kernels") as caught:
        model(torch.randn(3, 8))
    assert not isinstance(caught.value, torch._dynamo.exc.BackendCompilerFailed)
    torch._dynamo.reset()
