"""Static graphs per capture size, for any graph platform: ``StaticGraphWrapper``.

A platform supplies the graph machinery as a ``GraphAPI`` (CUDA graphs in the
CUDA plugin, simulated NPU graphs in ascend_stub); this module supplies the
bookkeeping of the static-graph contract on top of it, so every graph platform
keeps the same rules:

- per size: ``graph_warmups`` plain runs, then a capture into the one shared
  pool, then replays; the input addresses are checked on the first replay of
  each size (every replay with ``debug_checks``);
- the last piece's outputs are held weakly (``GraphAPI.weak_ref``);
- one class plays every role, chosen by ``runtime_mode``: PIECEWISE around each
  capturable piece or Inductor partition, FULL around the whole split model, where
  it also pins the step's graph mode in the forward context so the pieces inside
  run plain in a FULL step and only they capture in a PIECEWISE step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch.fx

from slotwise.compilation.compile_counters import counters
from slotwise.compilation.config import CompilationConfig, GraphMode
from slotwise.compilation.piecewise_backend import (
    CompiledPiecewiseBackend,
    find_size_source,
    read_size,
)
from slotwise.compilation.static_graph import (
    StaticGraphError,
    check_capture_allowed,
    check_input_addresses,
    input_addresses,
    runtime_graph_mode,
    step_size,
)
from slotwise.forward_context import set_forward_context, try_get_forward_context

logger = logging.getLogger("slotwise")


class StaticGraph(Protocol):
    def capture(self, fn: Callable[[], Any], pool: Any, *, quiet: bool) -> Any:
        """Record ``fn`` into this graph and return its outputs (graph-owned memory).

        ``quiet`` skips the garbage collection and cache emptying a capture normally
        starts with: done once for the first piece, repeating it per piece makes
        capture slow.
        """

    def replay(self) -> None:
        """Run the recorded work again on the captured addresses."""


class GraphAPI(Protocol):
    def new_graph(self) -> StaticGraph: ...

    def pool(self) -> Any:
        """The memory pool every graph of the process captures into."""

    def synchronize(self) -> None: ...

    def weak_ref(self, outputs: Any) -> Any:
        """Non-owning aliases of ``outputs`` (see ``weak_ref_tensors``)."""


@dataclass
class SizeEntry:
    warmups_done: int = 0
    graph: StaticGraph | None = None
    outputs: Any = None
    addresses: list[int | None] | None = None
    addresses_checked: bool = False


class StaticGraphWrapper:
    #: The graph API used when none is passed; graph platforms set it in a subclass.
    default_graph_api: ClassVar[GraphAPI | None] = None

    def __init__(
        self,
        runnable: Callable[..., Any],
        config: CompilationConfig,
        *,
        runtime_mode: GraphMode,
        example_inputs: Sequence[Any] | None = None,
        piece_index: int = 0,
        num_pieces: int = 1,
        graph_api: GraphAPI | None = None,
        **kwargs: Any,
    ) -> None:
        if not runtime_mode.is_runtime_mode or runtime_mode == GraphMode.NONE:
            raise ValueError(f"runtime_mode must be PIECEWISE or FULL, not {runtime_mode.name}")
        self.runnable = runnable
        self.config = config
        self.runtime_mode = runtime_mode
        # Partitions of an Inductor graph have no example inputs: their size comes
        # from the forward context's batch descriptor.
        self.size_source = find_size_source(example_inputs or ())
        api = graph_api or self.default_graph_api
        if api is None:
            raise TypeError(f"{type(self).__name__} needs a graph_api (or a default_graph_api)")
        self.graph_api = api
        self.name = (
            "full model graph"
            if runtime_mode == GraphMode.FULL
            else f"piece {piece_index} of {num_pieces}"
        )
        # The last piece's outputs leave the graph world: hold them weakly so the pool
        # can reuse their memory; the first piece's capture may clean up memory first.
        self.weak_outputs = piece_index == num_pieces - 1
        self.quiet_capture = piece_index != 0
        self.entries: dict[int, SizeEntry] = {}

    def __call__(self, *args: Any) -> Any:
        size = step_size(read_size(self.size_source, args))
        mode = runtime_graph_mode(self.config, size)
        if self.runtime_mode == GraphMode.FULL:
            with _pinned_graph_mode(mode):
                return self._run(mode, size, args)
        return self._run(mode, size, args)

    def _run(self, mode: GraphMode, size: int | None, args: Sequence[Any]) -> Any:
        if mode != self.runtime_mode:
            return self.runnable(*args)
        if size is None or size not in (self.config.capture_sizes or ()):
            raise StaticGraphError(
                f"{self.name}: this step asks for {mode.name} graphs, but its size {size} is "
                f"not a capture size; pad the batch to one of {self.config.capture_sizes} "
                "(slotwise.runner does) or run the step with graph_mode=NONE"
            )
        entry = self.entries.setdefault(size, SizeEntry())
        if entry.graph is None:
            if entry.warmups_done < self.config.graph_warmups:
                entry.warmups_done += 1
                return self.runnable(*args)
            self._capture(size, entry, args)
        elif not entry.addresses_checked or self.config.debug_checks:
            check_input_addresses(self.name, size, entry.addresses or [], args)
            entry.addresses_checked = True
        assert entry.graph is not None
        entry.graph.replay()
        return entry.outputs

    def _capture(self, size: int, entry: SizeEntry, args: Sequence[Any]) -> None:
        check_capture_allowed(self.name, size)
        entry.addresses = input_addresses(args)
        graph = self.graph_api.new_graph()
        outputs = graph.capture(
            lambda: self.runnable(*args), self.graph_api.pool(), quiet=self.quiet_capture
        )
        entry.outputs = self.graph_api.weak_ref(outputs) if self.weak_outputs else outputs
        entry.graph = graph
        counters.bump("num_graphs_captured")
        logger.debug("%s: captured a static graph for size %d", self.name, size)


@contextlib.contextmanager
def _pinned_graph_mode(mode: GraphMode) -> Iterator[None]:
    """Make ``mode`` the step's graph mode for everything called inside."""
    context = try_get_forward_context()
    if context is None:
        with set_forward_context(None, graph_mode=mode):
            yield
        return
    previous, context.graph_mode = context.graph_mode, mode
    try:
        yield
    finally:
        context.graph_mode = previous


class StaticGraphPiecewiseBackend(CompiledPiecewiseBackend):
    """Compile-and-dispatch plus, in PIECEWISE steps, a static graph per capture size.

    Graph platforms subclass it and set ``wrapper_cls`` to their ``StaticGraphWrapper``
    subclass; ``graph_api`` overrides the wrapper's default (tests pass a CPU stand-in).
    Sizes outside ``capture_sizes`` run the compiled piece without a graph.
    """

    wrapper_cls: ClassVar[type[StaticGraphWrapper]] = StaticGraphWrapper

    def __init__(
        self,
        graph: torch.fx.GraphModule,
        config: CompilationConfig,
        *,
        graph_api: GraphAPI | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(graph, config, **kwargs)
        self.graph_wrapper = self.wrapper_cls(
            self.run_compiled,
            config,
            runtime_mode=GraphMode.PIECEWISE,
            example_inputs=kwargs["example_inputs"],
            piece_index=self.piece_index,
            num_pieces=self.num_pieces,
            graph_api=graph_api,
        )

    def run_compiled(self, *args: Any) -> Any:
        return self.compiled_for(self.runtime_size(args), args)(*args)

    def __call__(self, *args: Any) -> Any:
        return self.graph_wrapper(*args)
