"""Inductor graph partition: configuration and wiring (its wrapper runs only on a GPU)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.decorators import mark_unbacked
from torch._inductor import utils as inductor_utils
from torch._subclasses.fake_tensor import FakeTensor

from slotwise.compilation import CompilationConfig, ConfigError, counters
from slotwise.compilation.splitting.inductor_partition import (
    PartitionedInductorCompiler,
    check_partition_supported,
    partition_wrapper_hook,
)
from slotwise.compilation.traced_inputs import traced_inputs
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel, ToyTransformer


@pytest.mark.parametrize("version", ["2.8.0", "2.7.1+cpu"])
def test_partition_on_an_old_torch_is_a_config_error(version):
    with pytest.raises(ConfigError, match=r"use_inductor_graph_partition.*torch >= 2\.9"):
        check_partition_supported(version)
    check_partition_supported("2.9.0")


def test_partition_needs_the_inductor_backend():
    with pytest.raises(ConfigError, match="needs backend='inductor'"):
        SillyModel(compilation_config={"backend": "eager", "use_inductor_graph_partition": True})


def test_splitting_ops_are_part_of_the_compile_cache_key():
    def key(ops):
        config = CompilationConfig(
            backend="inductor", use_inductor_graph_partition=True, splitting_ops=ops
        )
        return PartitionedInductorCompiler(config, None).compute_hash()

    assert key(["a::b"]) != key(["a::c"])
    assert key(["a::b"]) == key(["a::b"])


def test_partition_hook_is_restored_even_after_an_error():
    def wrapper(fn, metadata):
        return fn

    previous = inductor_utils._unstable_customized_partition_wrapper.wrapper
    with pytest.raises(RuntimeError), partition_wrapper_hook(wrapper):
        assert inductor_utils._unstable_customized_partition_wrapper.wrapper is wrapper
        raise RuntimeError
    assert inductor_utils._unstable_customized_partition_wrapper.wrapper is previous


@pytest.mark.slow
def test_partition_compiles_the_whole_graph_without_an_fx_split(tmp_path, graph_api):
    config = CompilationConfig(
        backend="inductor",
        use_inductor_graph_partition=True,
        splitting_ops=TOY_SPLITTING_OPS,
        capture_sizes=[2],
        cache_dir=str(tmp_path),
    )
    torch.manual_seed(0)
    model = SillyModel(compilation_config=config)
    torch.manual_seed(0)
    reference = SillyModel(compilation_config=CompilationConfig(level=0))
    previous = inductor_utils._unstable_customized_partition_wrapper.wrapper
    with counters.expect(
        num_graphs_seen=1,
        num_piecewise_graphs_seen=1,
        num_piecewise_capturable_graphs_seen=1,
        num_backend_compilations=1,
    ):
        for size in (2, 2, 2, 5):
            x = torch.randn(size, 8)
            torch.testing.assert_close(model(x), reference(x))
    assert inductor_utils._unstable_customized_partition_wrapper.wrapper is previous
    # On the CPU Inductor never calls the partition wrapper: nothing is captured.
    assert graph_api.captures == []


def test_traced_fakes_are_the_fake_tensors_dynamo_traced():
    """Dynamo hands its backend real tensors; standalone_compile, given those, would fake
    them anew with fresh, sourceless symbols for every dimension in Dynamo's ShapeEnv."""
    seen = {}

    def backend(graph, example_inputs):
        context = torch._guards.TracingContext.get()
        seen["real"] = example_inputs
        seen["fakes"] = traced_inputs(list(example_inputs))
        seen["fake_mode"] = context.fake_mode
        return graph.forward

    linear = torch.nn.Linear(8, 12)
    x = torch.randn(3, 8)
    mark_unbacked(x, 0)
    torch.compile(lambda x: linear(x).chunk(3, dim=-1), backend=backend, fullgraph=True)(x)

    fakes = [value for value in seen["fakes"] if isinstance(value, torch.Tensor)]
    assert fakes and all(isinstance(value, FakeTensor) for value in fakes)
    assert all(value.fake_mode is seen["fake_mode"] for value in fakes)
    shapes = {tuple(str(size) for size in value.shape) for value in fakes}
    # The weights keep their sizes; the input keeps Dynamo's (unbacked) symbol.
    assert {("12", "8"), ("12",)} <= shapes
    (input_shape,) = shapes - {("12", "8"), ("12",)}
    assert input_shape[0].startswith("u") and input_shape[1] == "8"
    symints = [value for value in seen["real"] if isinstance(value, torch.SymInt)]
    assert [value for value in seen["fakes"] if isinstance(value, torch.SymInt)] == symints


@pytest.fixture
def cold_inductor_cache(tmp_path, monkeypatch):
    """An empty Inductor cache for this test: the failure it guards against hid behind
    AOTAutograd cache hits, which skip the tracing."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    inductor_utils.clear_caches()  # in-memory caches of earlier tests' compiles
    yield tmp_path / "inductor"
    inductor_utils.clear_caches()


@pytest.mark.slow
@pytest.mark.parametrize("first_size", [1, 4])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_partition_compiles_a_toy_transformer_with_a_cold_inductor_cache(
    tmp_path, cold_inductor_cache, num_layers, first_size
):
    config = CompilationConfig(
        level=3,
        backend="inductor",
        use_inductor_graph_partition=True,
        splitting_ops=TOY_SPLITTING_OPS,
        cache_dir=str(tmp_path / "slotwise"),
    )
    torch.manual_seed(0)
    model = ToyTransformer(num_layers, compilation_config=config)
    reference = ToyTransformer(num_layers, compilation_config=CompilationConfig(level=0))
    reference.load_state_dict(model.state_dict())
    with counters.expect(
        num_graphs_seen=1,
        num_piecewise_graphs_seen=1,
        num_piecewise_capturable_graphs_seen=1,
        num_backend_compilations=1,
        num_inductor_compiles=1,
        num_cache_hits=0,
    ):
        for size in (first_size, 7, 5 - first_size, 2):
            ids = torch.randint(0, 64, (size,))
            torch.testing.assert_close(model(ids), reference(ids))
    assert any(cold_inductor_cache.iterdir())  # it really compiled into the cold cache


@pytest.mark.slow
@pytest.mark.parametrize("level", [2, 3], ids=["whole_graph", "partition"])
def test_inference_mode_compile_with_a_cold_inductor_cache(tmp_path, cold_inductor_cache, level):
    """Without autograd nothing fails in the backward compile that standalone_compile
    forces; the sourceless symbols then broke Dynamo's guards instead (IndexError in
    produce_guards_verbose). Level 2 hands Inductor Dynamo's inputs the same way."""
    config = CompilationConfig(
        level=level,
        backend="inductor",
        use_inductor_graph_partition=level == 3,
        splitting_ops=TOY_SPLITTING_OPS,
        cache_dir=str(tmp_path / "slotwise"),
    )
    torch.manual_seed(0)
    model = ToyTransformer(2, compilation_config=config)
    reference = ToyTransformer(2, compilation_config=CompilationConfig(level=0))
    reference.load_state_dict(model.state_dict())
    with torch.inference_mode(), counters.expect(num_inductor_compiles=1):
        for size in (4, 1, 7):
            ids = torch.randint(0, 64, (size,))
            torch.testing.assert_close(model(ids), reference(ids))
