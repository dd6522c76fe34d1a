"""Inductor graph partition: the alternative to splitting the graph with FX.

The whole graph goes to Inductor, which cuts it at the splitting ops itself
(``custom_should_partition_ops``) and hands every partition to a wrapper hook;
the platform's static-graph wrapper captures each partition, as the piecewise
backends capture each FX piece.  The hook is process-global in Inductor, so it is
set only around this compiler's own compile and load calls, then restored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from slotwise.compilation.compilers import CompiledPiece, Compiler, InductorCompiler
from slotwise.compilation.config import CompilationConfig, ConfigError, GraphMode

PartitionWrapper = Callable[[Callable[..., Any], Any], Callable[..., Any]]

MIN_TORCH = "2.9"


def check_partition_supported(torch_version: str) -> None:
    if torch.torch_version.TorchVersion(torch_version) < MIN_TORCH:
        raise ConfigError(
            f"compilation config key 'use_inductor_graph_partition': needs torch >= {MIN_TORCH}"
            f", this is torch {torch_version}; upgrade torch or split with FX "
            "(use_inductor_graph_partition=false)"
        )


class PartitionedInductorCompiler(Compiler):
    """Inductor with graph partition at the splitting ops; the splitting ops become part
    of the Inductor options, hence of the compile cache key."""

    name = "inductor_partition"
    supports_persistence = True

    def __init__(self, config: CompilationConfig, wrap_partition: PartitionWrapper | None):
        check_partition_supported(torch.__version__)
        super().__init__(config)
        options = dict(config.inductor_config)
        options.update(
            graph_partition=True, custom_should_partition_ops=config.resolved_splitting_ops
        )
        self.inductor = InductorCompiler(config.replace(inductor_config=options))
        self.wrap_partition = wrap_partition

    def compute_hash(self) -> str:
        return self.inductor.compute_hash()

    def compile(
        self,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        runtime_shape: int | None,
    ) -> CompiledPiece:
        with partition_wrapper_hook(self.wrap_partition):
            return self.inductor.compile(graph, example_inputs, runtime_shape=runtime_shape)

    def load(
        self,
        path: str,
        graph: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        runtime_shape: int | None,
    ) -> Callable[..., Any]:
        with partition_wrapper_hook(self.wrap_partition):
            return self.inductor.load(path, graph, example_inputs, runtime_shape=runtime_shape)


@contextlib.contextmanager
def partition_wrapper_hook(wrapper: PartitionWrapper | None) -> Iterator[None]:
    """Install ``wrapper`` as Inductor's partition wrapper for the block, then restore."""
    from torch._inductor import utils

    previous = utils._unstable_customized_partition_wrapper.wrapper
    utils.set_customized_partition_wrappers(wrapper)
    try:
        yield
    finally:
        utils.set_customized_partition_wrappers(previous)


def platform_partition_wrapper(
    wrapper_cls: type | None, config: CompilationConfig
) -> PartitionWrapper | None:
    """Wrap each partition in the platform's static-graph wrapper (PIECEWISE role), in
    graph modes with piecewise graphs (the config is settled by the time Inductor calls
    ``wrap``)."""
    if wrapper_cls is None:
        return None

    def wrap(partition: Callable[..., Any], metadata: Any) -> Callable[..., Any]:
        if config.graph_mode is None or not config.graph_mode.has_piecewise_graphs:
            return partition
        return wrapper_cls(
            partition,
            config,
            runtime_mode=GraphMode.PIECEWISE,
            piece_index=metadata.partition_index,
            num_pieces=metadata.num_partitions,
        )

    return wrap
