"""The functions torch.compile calls with each Dynamo graph, one per compilation level."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from tqdm import tqdm

from slotwise.compilation.cache.compile_cache import CompileCache
from slotwise.compilation.compile_counters import counters
from slotwise.compilation.compilers import Compiler, check_inductor_targets, make_compiler
from slotwise.compilation.config import CompilationConfig, GraphMode
from slotwise.compilation.direct_entry import traced_inputs_now
from slotwise.compilation.splitting.fx_split import split_graph
from slotwise.compilation.splitting.inductor_partition import (
    PartitionedInductorCompiler,
    platform_partition_wrapper,
)
from slotwise.compilation.splitting.piecewise_backend import (
    CompiledPiecewiseBackend,
    piecewise_backend_cls,
)
from slotwise.compilation.static_graphs.wrapper import StaticGraphWrapper, graph_wrapper_cls
from slotwise.compilation.trace_paths import Path, Unpersistable
from slotwise.compilation.traced_inputs import traced_inputs
from slotwise.compilation.warm_start.store import WarmStartStore
from slotwise.platforms import Platform, get_current_platform

DynamoBackend = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]


def as_is_backend(config: CompilationConfig) -> DynamoBackend:
    """Level 1: plain torch.compile with the configured compiler; Dynamo guards as usual."""
    if config.backend in ("eager", "inductor"):
        from torch._dynamo.backends.registry import lookup_backend

        if config.backend == "inductor":
            check_inductor_targets(get_current_platform())

        compile_graph = lookup_backend(config.backend)
    else:
        compiler = make_compiler(config.backend, config)

        def compile_graph(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            return compiler.compile(graph, example_inputs, runtime_shape=None).fn

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        counters.bump("num_graphs_seen")
        return compile_graph(graph, example_inputs)

    return backend


class TraceOnceBackend:
    """Levels 2 and 3: compile each Dynamo graph of one model, once.

    At level 3 the graph is split at the splitting ops and every capturable piece
    runs in the backend ``piecewise_backend_cls`` picks (or, with Inductor graph
    partition, Inductor splits and each partition is wrapped in a static-graph
    wrapper); at level 2 the whole graph is one compile-and-dispatch piece.  FULL
    graph modes wrap the result in a ``StaticGraphWrapper`` on the platform's GraphAPI.
    """

    def __init__(
        self,
        config: CompilationConfig,
        platform: Platform,
        *,
        traced_code: dict[str, str],
        piecewise: bool,
        warm_start: WarmStartStore | None = None,
    ) -> None:
        self.config = config
        self.warm_start = warm_start
        self.platform = platform
        # The model's factors of the cache key's traced-code group; each graph adds its index.
        self.traced_code = traced_code
        self.partition = piecewise and config.use_inductor_graph_partition
        self.split = piecewise and not self.partition
        self.compiler: Compiler = (
            PartitionedInductorCompiler(
                config,
                platform_partition_wrapper(graph_wrapper_cls(platform), config),
            )
            if self.partition
            else make_compiler(config.backend, config)
        )
        self.graphs_compiled = 0
        # For the direct entry: the compiled graph, its inputs' paths and traced values
        # (or why they cannot be fetched without Dynamo), and the first call's outputs.
        self.compiled: Callable[..., Any] | None = None
        self.graph_inputs: tuple[list[Path], list[Any]] | None = None
        self.no_direct_entry = ""
        self.first_outputs: list[Any] | None = None

    def _new_cache(self) -> CompileCache:
        factors = dict(self.traced_code, graph_index=str(self.graphs_compiled))
        self.graphs_compiled += 1
        return CompileCache(self.config, self.compiler, factors=factors)

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        counters.bump("num_graphs_seen")
        if self.warm_start is not None:
            self.warm_start.capture(graph)
        try:
            self.graph_inputs = traced_inputs_now(graph)
        except Exception as err:  # noqa: BLE001 - never fail the compile over the entry
            self.no_direct_entry = str(err) if isinstance(err, Unpersistable) else repr(err)
        compiled = self.build(graph, example_inputs)
        self.compiled = compiled
        return self._noting_first_outputs(compiled)

    def _noting_first_outputs(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled``, keeping its first call's outputs: how the forward's result is
        built from them is what the direct entry and the warm-start store reproduce."""
        backend = self

        def run(*args: Any) -> Any:
            outputs = compiled(*args)
            if backend.first_outputs is None:
                backend.first_outputs = list(outputs) if isinstance(outputs, (tuple, list)) else []
            return outputs

        return run

    def take_first_outputs(self) -> list[Any] | None:
        """The first call's graph outputs (None before it), kept no longer."""
        outputs, self.first_outputs = self.first_outputs, []
        return outputs

    def first_cache(self) -> CompileCache:
        """The compile cache the model's first (at levels 2 and 3: only) graph will use."""
        factors = dict(self.traced_code, graph_index="0")
        return CompileCache(self.config, self.compiler, factors=factors)

    def build(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        """The runnable model for one Dynamo graph, or one loaded from a warm-start entry."""
        cache = self._new_cache()
        if self.split:
            compiled = self._split(graph, cache)
        else:
            compiled = CompiledPiecewiseBackend(
                graph,
                self.config,
                piece_index=0,
                num_pieces=1,
                example_inputs=example_inputs,
                compile_cache=cache,
            )
            if self.partition:
                # Counted as vLLM does: one piece, capturable, that Inductor partitions.
                counters.bump("num_piecewise_graphs_seen")
                counters.bump("num_piecewise_capturable_graphs_seen")
        if self.config.graph_mode and self.config.graph_mode.has_full_graphs:
            compiled = StaticGraphWrapper(
                compiled,
                self.config,
                runtime_mode=GraphMode.FULL,
                graph_api=self.platform.get_graph_api(),
                example_inputs=traced_inputs(example_inputs),
            )
        return compiled

    def _split(self, graph: torch.fx.GraphModule, cache: CompileCache) -> torch.fx.GraphModule:
        split, pieces = split_graph(graph, self.config.resolved_splitting_ops)
        capturable = [piece.name for piece in pieces if piece.is_capturable]
        counters.bump("num_piecewise_graphs_seen", len(pieces))
        counters.bump("num_piecewise_capturable_graphs_seen", len(capturable))
        backend_cls = piecewise_backend_cls(self.platform, self.config)
        # A bar on terminals only (tqdm's disable=None): Inductor takes seconds per piece.
        progress = tqdm(total=len(capturable), desc="compiling pieces", unit="piece", disable=None)

        def make_backend(name: str, piece_inputs: Sequence[Any]) -> Any:
            backend = backend_cls(
                getattr(split, name),
                self.config,
                piece_index=capturable.index(name),
                num_pieces=len(capturable),
                example_inputs=piece_inputs,
                compile_cache=cache,
            )
            progress.update()
            return backend

        with progress:
            _install_piece_backends(split, capturable, make_backend)
        for piece in pieces:
            if piece.is_splitting:
                # Call the splitting piece's generated code directly, not through
                # nn.Module.__call__ and the lazy forward of a GraphModule not yet
                # recompiled: per-step overhead that otherwise grows with every layer.
                if isinstance(piece.graph, _LazyGraphModule):
                    piece.graph.real_recompile()
                split.__dict__[piece.name] = piece.graph.forward
        return split


def _install_piece_backends(
    split: torch.fx.GraphModule,
    capturable: list[str],
    make_backend: Callable[[str, Sequence[Any]], Any],
) -> None:
    """Swap every capturable piece for its backend, built with the piece's inputs as
    traced: the fake values the split copied from the traced graph onto the piece's
    placeholders (Dynamo's own, or on a warm start the ones propagated once on load)."""
    for name in capturable:
        piece = getattr(split, name)
        inputs = []
        for node in piece.graph.find_nodes(op="placeholder"):
            if "example_value" not in node.meta:
                raise RuntimeError(
                    f"input {node.name} of piece {name} has no traced value; the graph "
                    "handed to the backend lacks Dynamo's node metadata"
                )
            inputs.append(node.meta["example_value"])
        # The generated code calls self.<name>(...): an instance attribute takes
        # precedence over the registered submodule of the same name.
        split.__dict__[name] = make_backend(name, inputs)
