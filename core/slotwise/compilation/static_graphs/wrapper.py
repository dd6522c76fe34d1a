"""Static graphs per capture size, for any graph platform: ``StaticGraphWrapper``.

A platform supplies the graph machinery as a ``GraphAPI`` (CUDA graphs in the
CUDA plugin, simulated NPU graphs in ascend_stub); this module supplies the
bookkeeping of the static-graph contract on top of it, so every graph platform
keeps the same rules:

- per size: ``graph_warmups`` plain runs, then a capture into the one shared
  pool, then replays; the input addresses are checked on the first replay of
  each size, and that the replay right after the capture wrote into the captured
  outputs (both on every replay with ``debug_checks``);
- with ``graph_copy_inputs`` the batch-sized tensor inputs are copied into buffers
  the wrapper allocated at capture, so callers may pass new tensors every step;
- the last piece's outputs are held weakly (``GraphAPI.weak_ref``);
- one class plays every role, chosen by ``runtime_mode``: PIECEWISE around each
  capturable piece or Inductor partition, FULL around the whole split model.  Each
  acts only in steps whose forward context carries its own mode (as the
  ``GraphDispatcher`` decided it) and runs plainly otherwise, so the pieces inside a
  FULL graph run plain and the FULL wrapper lets a PIECEWISE step through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from slotwise.attention.cache_allocation import kv_cache_allocations
from slotwise.attention.kv_cache_reads import KVCacheReads, kv_cache_reads, kv_caches_replaced
from slotwise.compilation import weight_registrations
from slotwise.compilation.compile_counters import counters
from slotwise.compilation.config import CompilationConfig, ConfigError, GraphMode
from slotwise.compilation.runtime_size import batch_sized_inputs, find_size_source, read_size
from slotwise.compilation.static_graphs.contract import (
    OutputsProbe,
    StaticGraphError,
    check_capture_allowed,
    check_input_addresses,
    check_outputs_written,
    graph_inputs,
    input_addresses,
)
from slotwise.compilation.static_graphs.graph_api import GraphAPI, StaticGraph
from slotwise.compilation.static_graphs.recorded_graph import through_recorder
from slotwise.forward_context import try_get_forward_context

if TYPE_CHECKING:
    from slotwise.platforms import Platform

logger = logging.getLogger(__name__)


@dataclass
class SizeEntry:
    warmups_done: int = 0
    graph: StaticGraph | None = None
    outputs: Any = None
    addresses: list[int | None] | None = None
    #: ``weight_registrations.count()`` when the input addresses were last checked (None:
    #: never): a weight replaced since may have moved, so they are checked again.
    addresses_checked_at: int | None = None
    #: Argument index -> the buffer the graph reads it from (``graph_copy_inputs``).
    buffers: dict[int, torch.Tensor] = field(default_factory=dict)
    #: Every check this size owes is done and nothing is copied in: a step only replays.
    replay_only: bool = False
    #: ``kv_cache_allocations()`` when the KV caches a FULL graph's capture read were last
    #: found in place (its attention reads them at their captured addresses); None for a
    #: piece, which reads none.
    caches_at: int | None = None
    #: The caches the capture read (``kv_cache_reads``).
    cache_reads: KVCacheReads = field(default_factory=list)


class StaticGraphWrapper:
    """Runs ``runnable`` plainly, or, in steps whose graph mode is ``runtime_mode``, as
    one static graph per capture size on ``graph_api`` (see the module docstring)."""

    def __init__(
        self,
        runnable: Callable[..., Any],
        config: CompilationConfig,
        *,
        runtime_mode: GraphMode,
        graph_api: GraphAPI | None,
        example_inputs: Sequence[Any] | None = None,
        piece_index: int = 0,
        num_pieces: int = 1,
    ) -> None:
        if not runtime_mode.is_runtime_mode or runtime_mode == GraphMode.NONE:
            raise ValueError(f"runtime_mode must be PIECEWISE or FULL, not {runtime_mode.name}")
        if graph_api is None:
            raise ConfigError(
                f"compilation config key 'graph_mode': {runtime_mode.name} graphs need a "
                "GraphAPI, but the platform's get_graph_api() returned None; use "
                "graph_mode=NONE (compiled models get it on such platforms, after the platform's "
                "check_and_update_config)"
            )
        self.runnable = runnable
        self.config = config
        self.runtime_mode = runtime_mode
        self.graph_api = graph_api
        # Partitions of an Inductor graph have no example inputs: their size comes
        # from the forward context's batch descriptor.
        self.size_source = find_size_source(example_inputs or ())
        self.copied_inputs = (
            batch_sized_inputs(example_inputs or ()) if config.graph_copy_inputs else []
        )
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
        # The step's mode as the GraphDispatcher decided it; no mode is NONE.
        context = try_get_forward_context()
        mode = context.graph_mode if context is not None else None
        if mode != self.runtime_mode:
            return self.runnable(*args)
        assert context is not None
        descriptor = context.batch_descriptor
        size = read_size(self.size_source, args) if descriptor is None else descriptor.num_tokens
        entry = None if size is None else self.entries.get(size)
        if (
            entry is not None
            and entry.replay_only
            and entry.addresses_checked_at == weight_registrations.count()
            and (entry.caches_at is None or entry.caches_at == kv_cache_allocations())
        ):
            assert entry.graph is not None
            entry.graph.replay()
            return entry.outputs
        if size is None or size not in (self.config.capture_sizes or ()):
            raise StaticGraphError(
                f"{self.name}: this step asks for {mode.name} graphs, but its size {size} is "
                f"not a capture size; pad the batch to one of {self.config.capture_sizes} "
                "(slotwise_engine.runner does) or run the step with graph_mode=NONE"
            )
        if entry is None:
            entry = self.entries[size] = SizeEntry()
        if entry.caches_at is not None and entry.caches_at != kv_cache_allocations():
            if kv_caches_replaced(entry.cache_reads):
                entry = self.entries[size] = self._for_new_caches(size)
            else:  # another model's caches were allocated
                entry.caches_at = kv_cache_allocations()
        if entry.graph is None:
            if entry.warmups_done < self.config.graph_warmups:
                entry.warmups_done += 1
                return self.runnable(*args)
            inputs = self._capture(size, entry, args)
            check_outputs = True  # the replay right after capture
        else:
            # A replay runs no Python: a partition's list stays as it was handed over.
            inputs = _copied_into(entry.buffers, args)
            registrations = weight_registrations.count()
            if entry.addresses_checked_at != registrations or self.config.debug_checks:
                check_input_addresses(self.name, size, entry.addresses or [], inputs)
                entry.addresses_checked_at = registrations
            check_outputs = self.config.debug_checks
            # From the next replay on, nothing is left to check or copy for this size.
            entry.replay_only = not (self.config.debug_checks or entry.buffers)
        self._replay(size, entry, inputs, check_outputs)
        return entry.outputs

    def _for_new_caches(self, size: int) -> SizeEntry:
        """A fresh entry for ``size``, whose graph was captured over KV caches that
        ``allocate_kv_caches`` has replaced since: it is captured again where captures
        may happen, else refused, never replayed on the old caches."""
        message = (
            f"{self.name}: the graph of size {size} was captured over KV caches that "
            "allocate_kv_caches has replaced since (a second ModelRunner over the same "
            "model?), and its replays would read the old ones"
        )
        try:
            check_capture_allowed(self.name, size)
        except StaticGraphError:
            raise StaticGraphError(
                f"{message}; capture again (ModelRunner.capture()) after allocating the "
                "caches, or give each runner a model of its own"
            ) from None
        logger.info("%s; capturing it again", message)
        return SizeEntry()

    def _replay(self, size: int, entry: SizeEntry, inputs: Sequence[Any], check: bool) -> None:
        """Replay ``size``'s graph; with ``check``, make sure it wrote the captured outputs
        (``inputs``: what it reads, as ``graph_inputs`` opens them)."""
        assert entry.graph is not None
        if not check:
            entry.graph.replay()
            return
        probe = OutputsProbe(entry.outputs, inputs)
        returned = entry.graph.replay()
        check_outputs_written(self.name, size, self.graph_api, probe, returned)

    def _capture(self, size: int, entry: SizeEntry, args: Sequence[Any]) -> list[Any]:
        """Capture the graph of ``size``; return what it reads (``graph_inputs``), taken
        before the capture runs: a partition empties the list it is handed."""
        weight_registrations.watch()
        check_capture_allowed(self.name, size)
        entry.buffers = {index: args[index].clone() for index in self.copied_inputs}
        args = [entry.buffers.get(index, arg) for index, arg in enumerate(args)]
        inputs = graph_inputs(args)
        entry.addresses = input_addresses(inputs)
        graph = self.graph_api.new_graph()
        with kv_cache_reads() as reads:
            outputs = graph.capture(
                lambda: self.runnable(*args), self.graph_api.pool(), quiet=self.quiet_capture
            )
        entry.outputs = self.graph_api.weak_ref(outputs) if self.weak_outputs else outputs
        entry.graph = graph
        if self.runtime_mode == GraphMode.FULL:
            entry.caches_at, entry.cache_reads = kv_cache_allocations(), reads
        counters.bump("num_graphs_captured")
        logger.debug("%s: captured a static graph for size %d", self.name, size)
        return inputs


def _copied_into(buffers: dict[int, torch.Tensor], args: Sequence[Any]) -> Sequence[Any]:
    """``args`` with each argument that has a buffer copied into it and replaced by it."""
    if not buffers:
        return args
    staged = list(args)
    for index, buffer in buffers.items():
        buffer.copy_(staged[index])
        staged[index] = buffer
    return staged


def graph_wrapper_cls(platform: Platform) -> Callable[..., StaticGraphWrapper] | None:
    """``StaticGraphWrapper`` bound to the platform's ``GraphAPI``, for Inductor's graph
    partitions; None without a GraphAPI.  A partition is Inductor code, whose kernels the
    dispatcher never sees, so a ``RecordedGraph`` records each call of it as one step."""
    graph_api = platform.get_graph_api()
    if graph_api is None:
        return None

    def wrap(partition: Callable[..., Any], config: CompilationConfig, **kwargs: Any) -> Any:
        return StaticGraphWrapper(
            through_recorder(partition), config, graph_api=graph_api, **kwargs
        )

    return wrap
