"""Piecewise backends: what runs each capturable piece of a split model graph.

At level 3 slotwise hands every capturable piece to a piecewise backend:
``CompiledPiecewiseBackend`` (compile and dispatch on the runtime size), or, in
graph modes with piecewise graphs, ``StaticGraphPiecewiseBackend`` on top of the
platform's ``GraphAPI``.  A platform wanting full control of its pieces returns its
own ``AbstractPiecewiseBackend`` subclass from ``get_piecewise_backend_cls()``; its
pieces then keep the static-graph contract only if that class does (input addresses
checked with ``static_graph.check_input_addresses``, replays written into the captured
outputs), which the conformance check ``static_graphs`` verifies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from slotwise.compilation.compile_lock import compile_lock
from slotwise.compilation.config import GraphMode
from slotwise.compilation.runtime_size import find_size_source, read_size
from slotwise.compilation.static_graphs.recorded_graph import through_recorder
from slotwise.compilation.static_graphs.wrapper import StaticGraphWrapper

if TYPE_CHECKING:
    from slotwise.compilation.cache.compile_cache import CompileCache
    from slotwise.compilation.config import CompilationConfig
    from slotwise.compilation.static_graphs.graph_api import GraphAPI
    from slotwise.platforms import Platform


class AbstractPiecewiseBackend:
    """Runs one capturable piece.

    Constructor arguments, all given by slotwise:

    - ``graph``: the piece as an FX ``GraphModule``;
    - ``config``: the model's ``CompilationConfig``, already adjusted by the
      platform's ``check_and_update_config`` (``graph_mode``, ``capture_sizes``,
      ``compile_sizes``, ``graph_warmups``, ``debug_checks`` are what backends read);
    - ``piece_index`` / ``num_pieces``: position among the model's capturable pieces,
      so a backend knows the first piece (where captures start) and the last one
      (whose outputs a graph backend holds only weakly);
    - ``example_inputs``: the inputs seen while tracing, with symbolic sizes;
    - ``compile_cache``: ``compile_cache.compile(graph, inputs, runtime_shape=n)``
      returns a compiled callable, from the persistent cache when it can;
    - ``graph_api``: the platform's ``GraphAPI`` (``Platform.get_graph_api()``), None
      on platforms without static graphs.

    ``__call__(*args)`` must return what ``graph(*args)`` returns.  Counters a
    subclass bumps itself: ``num_graphs_captured`` per static graph captured
    (compilations are counted by the compile cache).
    """

    def __init__(
        self,
        graph: torch.fx.GraphModule,
        config: CompilationConfig,
        *,
        piece_index: int,
        num_pieces: int,
        example_inputs: Sequence[Any],
        compile_cache: CompileCache,
        graph_api: GraphAPI | None = None,
        **kwargs: Any,
    ) -> None:
        self.graph = graph
        self.config = config
        self.piece_index = piece_index
        self.num_pieces = num_pieces
        self.compile_cache = compile_cache
        self.graph_api = graph_api
        self.size_source = find_size_source(example_inputs)

    @property
    def is_first_piece(self) -> bool:
        return self.piece_index == 0

    @property
    def is_last_piece(self) -> bool:
        return self.piece_index == self.num_pieces - 1

    def runtime_size(self, args: Sequence[Any]) -> int | None:
        """The size along the dynamic dimension (the token count), None for static pieces."""
        return read_size(self.size_source, args)

    def __call__(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(*args)")


class CompiledPiecewiseBackend(AbstractPiecewiseBackend):
    """Compiles a general (dynamic-shape) version at construction, and one per size in
    ``compile_sizes`` lazily at its first use; dispatches on the runtime size."""

    def __init__(self, graph: torch.fx.GraphModule, config: CompilationConfig, **kwargs: Any):
        super().__init__(graph, config, **kwargs)
        self.general = self._compile(kwargs["example_inputs"], runtime_shape=None)
        self.compile_sizes = frozenset(config.compile_sizes)
        self.by_size: dict[int, Callable[..., Any]] = {}

    def compiled_for(self, size: int | None, args: Sequence[Any]) -> Callable[..., Any]:
        """The compiled callable for ``size``, compiling a specialised one on first use."""
        if size is None or size not in self.compile_sizes:
            return self.general
        compiled = self.by_size.get(size)
        if compiled is None:
            with compile_lock:
                compiled = self.by_size.get(size)
                if compiled is None:
                    compiled = self._compile(list(args), runtime_shape=size)
                    self.by_size[size] = compiled
        return compiled

    def _compile(self, inputs: Sequence[Any], runtime_shape: int | None) -> Callable[..., Any]:
        """The piece compiled through the cache.  Compiled code the dispatcher cannot see
        (Inductor's) is recorded as one step when a RecordedGraph captures it; plain FX
        code is recorded op by op."""
        compiled = self.compile_cache.compile(self.graph, inputs, runtime_shape=runtime_shape)
        return through_recorder(compiled)

    def __call__(self, *args: Any) -> Any:
        if not self.compile_sizes:
            return self.general(*args)  # the common case, kept cheap: it runs every step
        return self.compiled_for(self.runtime_size(args), args)(*args)


class StaticGraphPiecewiseBackend(CompiledPiecewiseBackend):
    """Compile-and-dispatch plus, in PIECEWISE steps, a static graph per capture size
    on the platform's ``GraphAPI``; other sizes run the compiled piece without one."""

    def __init__(self, graph: torch.fx.GraphModule, config: CompilationConfig, **kwargs: Any):
        super().__init__(graph, config, **kwargs)
        self.graph_wrapper = StaticGraphWrapper(
            self.run_compiled,
            config,
            runtime_mode=GraphMode.PIECEWISE,
            graph_api=self.graph_api,
            example_inputs=kwargs["example_inputs"],
            piece_index=self.piece_index,
            num_pieces=self.num_pieces,
        )

    def run_compiled(self, *args: Any) -> Any:
        return self.compiled_for(self.runtime_size(args), args)(*args)

    def __call__(self, *args: Any) -> Any:
        return self.graph_wrapper(*args)


def piecewise_backend_cls(
    platform: Platform, config: CompilationConfig
) -> Callable[..., AbstractPiecewiseBackend]:
    """What runs each capturable piece: the platform's own class if it has one, else
    slotwise's, which captures only in graph modes with piecewise graphs; either way
    bound to the platform's ``GraphAPI``."""
    cls = platform.get_piecewise_backend_cls()
    if cls is None:
        graphs = config.graph_mode is not None and config.graph_mode.has_piecewise_graphs
        cls = StaticGraphPiecewiseBackend if graphs else CompiledPiecewiseBackend
    return functools.partial(cls, graph_api=platform.get_graph_api())
