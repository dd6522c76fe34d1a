"""Compilers: the eager reference, Inductor's standalone compile, and third-party classes."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from slotwise.compilation.compile_counters import counters
from slotwise.compilation.compilers import (
    CompiledPiece,
    Compiler,
    EagerCompiler,
    InductorCompiler,
    make_compiler,
)
from slotwise.compilation.config import CompilationConfig, ConfigError


def mlp(x, w):
    return torch.relu(x @ w) + 1.0


def two_outputs(x, w):
    y = x @ w
    return y.sin(), y.cos()


def test_eager_compiler_runs_the_graph_and_counts():
    graph = torch.fx.symbolic_trace(mlp)
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    compiler = EagerCompiler(CompilationConfig())
    with counters.expect(num_eager_compiles=1, num_inductor_compiles=0):
        piece = compiler.compile(graph, [x, w], runtime_shape=None)
    assert isinstance(piece, CompiledPiece)
    assert piece.save is None
    assert not compiler.supports_persistence
    torch.testing.assert_close(piece.fn(x, w), mlp(x, w))
    with pytest.raises(NotImplementedError, match="eager"):
        compiler.load("/nonexistent", graph, [x, w], runtime_shape=None)


def test_make_compiler_builds_the_named_compilers():
    config = CompilationConfig()
    assert type(make_compiler("eager", config)) is EagerCompiler
    inductor = make_compiler("inductor", config)
    assert type(inductor) is InductorCompiler
    assert inductor.supports_persistence


def test_make_compiler_imports_a_third_party_subclass(tmp_path, monkeypatch):
    (tmp_path / "vendor_compiler.py").write_text(
        textwrap.dedent(
            """
            from slotwise.compilation.compilers import CompiledPiece, Compiler

            class Outer:
                class VendorCompiler(Compiler):
                    name = "vendor"

                    def compile(self, graph, example_inputs, *, runtime_shape):
                        return CompiledPiece(fn=graph.forward)

            NotACompiler = dict
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = CompilationConfig(backend="vendor_compiler:Outer.VendorCompiler")
    compiler = make_compiler(config.backend, config)
    assert compiler.name == "vendor"
    assert compiler.config is config
    assert compiler.compute_hash() == ""
    with pytest.raises(ConfigError, match=r"'backend'.*vendor_compiler:NotACompiler.*not a"):
        make_compiler("vendor_compiler:NotACompiler", config)
    with pytest.raises(ConfigError, match=r"'backend'.*cannot get 'Missing'.*module:Class"):
        make_compiler("vendor_compiler:Missing", config)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("no_such_module_xyz:Compiler", r"cannot import module 'no_such_module_xyz'"),
        ("", r"got ''"),
        ("inductor2", r"got 'inductor2'"),
        ("module:", r"got 'module:'"),
    ],
)
def test_make_compiler_rejects_bad_backends(backend, message):
    with pytest.raises(ConfigError) as caught:
        make_compiler(backend, CompilationConfig())
    text = str(caught.value)
    assert "compilation config key 'backend'" in text
    assert '"eager", "inductor" or "module:Class"' in text
    assert re.search(message, text)


def test_inductor_compiler_needs_standalone_compile(monkeypatch):
    import torch._inductor

    monkeypatch.delattr(torch._inductor, "standalone_compile")
    with pytest.raises(
        ConfigError, match=rf"standalone_compile.*torch {re.escape(torch.__version__)}"
    ):
        InductorCompiler(CompilationConfig())


@pytest.mark.slow
def test_inductor_compiler_works_with_a_standalone_compile_that_cannot_take_donations(
    monkeypatch,
):
    """torch 2.11's standalone_compile has no ``donate_graph_module`` (a GPU machine's
    torch failed every Inductor piece on it): the compiler must not pass it there."""
    import torch._inductor

    real = torch._inductor.standalone_compile
    calls = []

    def older_standalone_compile(gm, example_inputs, *, dynamic_shapes="from_graph", options=None):
        calls.append(dynamic_shapes)
        return real(gm, example_inputs, dynamic_shapes=dynamic_shapes, options=options)

    monkeypatch.setattr(torch._inductor, "standalone_compile", older_standalone_compile)
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    # mlp returns one tensor, so the compiler makes its own flat copy it would donate.
    graph = make_fx(mlp)(x, w)
    piece = InductorCompiler(CompilationConfig()).compile(graph, [x, w], runtime_shape=3)
    torch.testing.assert_close(piece.fn(x, w), mlp(x, w))
    assert calls == ["from_example_inputs"]


def test_inductor_compiler_rejects_unknown_options_and_hashes_the_rest():
    with pytest.raises(ConfigError, match=r"'inductor_config'.*no_such_option"):
        InductorCompiler(CompilationConfig(inductor_config={"no_such_option": 1}))
    plain = InductorCompiler(CompilationConfig()).compute_hash()
    assert plain == InductorCompiler(CompilationConfig()).compute_hash()
    tuned = InductorCompiler(CompilationConfig(inductor_config={"max_autotune": True}))
    assert tuned.compute_hash() != plain


def test_compiler_subclasses_must_implement_compile():
    class Incomplete(Compiler):
        pass

    with pytest.raises(TypeError, match="compile"):
        Incomplete(CompilationConfig())


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x):
        y = self.proj(x).relu()
        # x.shape[0] makes Dynamo pass the batch size as a SymInt input.
        return y.view(x.shape[0], 4, 4).sum(-1) * 2


@pytest.mark.slow
def test_inductor_compiles_the_general_shape_inside_a_dynamo_backend():
    compiler = InductorCompiler(CompilationConfig(backend="inductor"))
    seen: list[list[object]] = []

    def backend(graph, example_inputs):
        seen.append(list(example_inputs))
        return compiler.compile(graph, example_inputs, runtime_shape=None).fn

    torch.manual_seed(0)
    model = Layer()
    compiled = torch.compile(model, backend=backend, dynamic=False, fullgraph=True)
    with counters.expect(num_inductor_compiles=1):
        for size in (3, 5, 9, 2):
            x = torch.randn(size, 8)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (inputs,) = seen
    assert any(isinstance(value, torch.SymInt) for value in inputs)


@pytest.mark.slow
def test_inductor_pieces_keep_their_output_structure_after_save_and_load(tmp_path):
    compiler = InductorCompiler(CompilationConfig(backend="inductor"))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    for fn in (mlp, two_outputs):
        graph = make_fx(fn)(x, w)
        piece = compiler.compile(graph, [x, w], runtime_shape=None)
        path = str(tmp_path / f"{fn.__name__}.bin")
        assert piece.save is not None
        piece.save(path)
        loaded = compiler.load(path, graph, [x, w], runtime_shape=None)
        for size in (4, 7, 1):
            xs = torch.randn(size, 8)
            expected = fn(xs, w)
            for result in (piece.fn(xs, w), loaded(xs, w)):
                assert type(result) is type(expected)
                torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_inductor_specialised_piece_refuses_other_sizes():
    compiler = InductorCompiler(CompilationConfig(backend="inductor"))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    graph = make_fx(mlp)(x, w)
    with counters.expect(num_inductor_compiles=1):
        piece = compiler.compile(graph, [x, w], runtime_shape=4)
    torch.testing.assert_close(piece.fn(x, w), mlp(x, w), rtol=1e-5, atol=1e-5)
    # Compiled for exactly these sizes: another size fails loudly, never computes garbage.
    with pytest.raises(AssertionError, match="expected size 5==4"):
        piece.fn(torch.randn(5, 8), w)


@pytest.mark.slow
def test_inductor_piece_without_an_artifact_is_not_saveable():
    # AOTAutograd's cache bypasses method calls on nodes without Dynamo's example values,
    # so this symbolic_trace graph compiles and runs but has nothing to save.
    compiler = InductorCompiler(CompilationConfig(backend="inductor"))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    piece = compiler.compile(torch.fx.symbolic_trace(two_outputs), [x, w], runtime_shape=None)
    assert piece.save is None
    torch.testing.assert_close(piece.fn(x, w), two_outputs(x, w), rtol=1e-5, atol=1e-5)
