"""Inductor graph partition: configuration and wiring (its wrapper runs only on a GPU)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor import utils as inductor_utils

from slotwise.compilation import CompilationConfig, ConfigError, counters
from slotwise.compilation.inductor_partition import (
    PartitionedInductorCompiler,
    check_partition_supported,
    partition_wrapper_hook,
)
from slotwise.testing.toy_models import TOY_SPLITTING_OPS, SillyModel


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
    with counters.expect(num_piecewise_graphs_seen=0, num_backend_compilations=1):
        for size in (2, 2, 2, 5):
            x = torch.randn(size, 8)
            torch.testing.assert_close(model(x), reference(x))
    assert inductor_utils._unstable_customized_partition_wrapper.wrapper is previous
    # On the CPU Inductor never calls the partition wrapper: nothing is captured.
    assert graph_api.captures == []
