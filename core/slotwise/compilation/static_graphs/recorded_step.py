"""Recorded decode steps: a step of a captured size as a fixed list of calls.

Once every graph a step replays has been captured and checked (its wrapper's entry for
the size is ``replay_only``), what the compiled model does in a uniform decode step no
longer depends on the step: under PIECEWISE it replays piece 0, runs layer 0's attention
on piece 0's static outputs, replays piece 1, and so on; under FULL it replays one graph.
``record_step`` reads that list from the model's direct entry and its split graph once;
``RecordedStep.run`` then makes those calls and nothing else, skipping the module calls,
the direct entry, the split graph's forward and the graph wrappers' per-step Python.

A recorded step is only as good as what it was read from, so each run first checks that
nothing it holds went stale, and reports itself invalid (the caller then takes the normal
path, which is correct by construction, and records again) when:

- a weight, buffer or submodule was registered anywhere since the recording (the direct
  entry's registration counter): a replaced parameter is re-bound, or refused, there;
- the model's compiled forward has another entry (a new trace, a new model);
- any recorded graph was dropped or recaptured (its wrapper's entry or graph changed);
- any attention layer's KV cache was reallocated.

Which steps are recorded at all is not decided here: the caller passes the
``GraphDispatcher``'s decision for the step, and only uniform decodes that run graphs
are recorded.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from slotwise.compilation import weight_registrations
from slotwise.compilation.config import GraphMode
from slotwise.compilation.static_graphs.dispatcher import StepGraphs
from slotwise.compilation.static_graphs.wrapper import SizeEntry, StaticGraphWrapper
from slotwise.forward_context import set_forward_context


class NotRecordable(Exception):
    """The model's step cannot be a fixed list of calls (the reason says why)."""


class NotReady(Exception):
    """A graph of the step is not captured and checked yet: record after a later step."""


@dataclass
class _Replay:
    """One recorded graph: replayed while its wrapper still holds it for the size
    (``RecordedStep.stale`` checks, inline as it runs every step)."""

    wrapper: StaticGraphWrapper
    size: int
    entry: SizeEntry


class RecordedStep:
    """The calls of one uniform decode step of ``graphs.padded_size`` tokens.

    ``calls``: what the step makes, in order; ``output``: the hidden states they leave
    (the tensor the model returned when the step was recorded); ``attention``: whether
    a call reads the step's attention metadata (from the forward context).
    """

    def __init__(
        self,
        graphs: StepGraphs,
        calls: Sequence[Callable[[], Any]],
        output: torch.Tensor,
        *,
        attention: bool,
        entry: Any,
        compiled: Any,
        replays: Sequence[_Replay],
        caches: Sequence[tuple[Any, torch.Tensor]],
    ) -> None:
        self.graphs = graphs
        self.calls = tuple(calls)
        self.output = output
        self.attention = attention
        self._entry = entry
        self._compiled = compiled
        self._replays = tuple(replays)
        #: What ``stale`` reads of each replay, every step: its wrapper's entries, the
        #: size, the entry recorded.
        self._graph_checks = tuple((r.wrapper.entries, r.size, r.entry) for r in self._replays)
        self._batch_descriptor = graphs.batch_descriptor
        self._caches = tuple((layer, cache, cache.data_ptr()) for layer, cache in caches)
        self._registrations = weight_registrations.count()
        #: The calls with each attention call bound to a metadata object by its backend
        #: (``LayerAttention.bind``), and that object: the runner hands the same one to
        #: every step of a shape, its tensors rewritten in place.
        self._bound: tuple[Callable[[], Any], ...] = ()
        self._bound_for: Any = None

    def stale(self) -> str | None:
        """Why the recording no longer holds, or None while it does."""
        if weight_registrations.count() != self._registrations:
            return "a parameter, buffer or submodule was registered since the recording"
        if self._compiled.compiled is not self._entry:
            return "the compiled model has a new entry"
        for index, (entries, size, entry) in enumerate(self._graph_checks):
            if entries.get(size) is not entry or not entry.replay_only or entry.graph is None:
                name = self._replays[index].wrapper.name
                return f"{name}'s graph of size {size} was dropped or recaptured"
        for layer, cache, address in self._caches:
            # The attention calls bound to a cache hold views of its memory: a cache
            # whose memory was swapped in place (``set_``) is another cache to them.
            if layer.kv_cache is not cache or (self.attention and cache.data_ptr() != address):
                return f"the KV cache of {layer.layer_name} was reallocated"
        return None

    def run(self, metadata: Any) -> torch.Tensor:
        """Make the recorded calls (attention reading ``metadata``); the hidden states.
        The caller checks :meth:`stale` first.

        The first step with a metadata object runs each layer's attention as the split
        graph would; later steps with the same object make its backend's bound calls.
        """
        # The guard torch.inference_mode enters, without its Python wrapper's ~2 µs.
        inference = (
            contextlib.nullcontext()
            if torch.is_inference_mode_enabled()
            else torch._C._InferenceMode(True)
        )
        if not self.attention:
            with inference:
                for call in self.calls:
                    call()
            return self.output
        with (
            inference,
            set_forward_context(
                metadata,
                graph_mode=self.graphs.mode,
                batch_descriptor=self._batch_descriptor,
            ),
        ):
            if metadata is self._bound_for:
                for call in self._bound:
                    call()
            else:
                for call in self.calls:
                    call()
                self._bound = tuple(
                    call.bind(metadata) if isinstance(call, _AttentionCall) else call
                    for call in self.calls
                )
                self._bound_for = metadata
        return self.output


def record_step(model: torch.nn.Module, graphs: StepGraphs, hidden: torch.Tensor) -> RecordedStep:
    """The step ``graphs`` of ``model`` as a list of calls, read after a normal step of
    that shape returned ``hidden``.  ``NotReady`` while a graph of the size is not
    captured and checked; ``NotRecordable`` when the model's step cannot be recorded."""
    from slotwise.attention.ops import LayerAttention
    from slotwise.compilation.compiled_modules import compiled_forward_of
    from slotwise.compilation.direct_entry import DirectEntry

    if graphs.mode == GraphMode.NONE or not graphs.uniform_decode:
        raise NotRecordable(f"a {graphs.mode.name} step that is not a uniform decode")
    compiled_forwards = [c for c in map(compiled_forward_of, model.modules()) if c is not None]
    if len(compiled_forwards) != 1:
        raise NotRecordable(f"the model has {len(compiled_forwards)} compiled modules, not one")
    (compiled,) = compiled_forwards
    entry = compiled.compiled
    if not isinstance(entry, DirectEntry):
        raise NotRecordable("the compiled model runs without slotwise's direct entry")
    size = graphs.padded_size
    runnable = entry.graph
    replays: list[_Replay] = []
    calls: list[Callable[[], Any]] = []
    attention = False
    if graphs.mode == GraphMode.FULL:
        if not (
            isinstance(runnable, StaticGraphWrapper) and runnable.runtime_mode == GraphMode.FULL
        ):
            raise NotRecordable("the compiled model has no FULL graph wrapper")
        replay = _replay_of(runnable, size)
        replays.append(replay)
        assert replay.entry.graph is not None
        calls.append(replay.entry.graph.replay)
        outputs = replay.entry.outputs
    else:
        if isinstance(runnable, StaticGraphWrapper):
            runnable = runnable.runnable  # a PIECEWISE step passes the FULL wrapper by
        split = getattr(runnable, "__self__", runnable)
        if not isinstance(split, torch.fx.GraphModule):
            raise NotRecordable("the compiled model is not a split graph")
        env: dict[torch.fx.Node, Any] = {}
        outputs = None
        for node in split.graph.nodes:
            if node.op == "placeholder":
                env[node] = _Input(node.name)
            elif node.op == "call_module":
                piece = getattr(split, str(node.target))
                wrapper = getattr(piece, "graph_wrapper", None)
                if not isinstance(wrapper, StaticGraphWrapper):
                    raise NotRecordable(f"{node.target} is not replayed by a graph wrapper")
                replay = _replay_of(wrapper, size)
                replays.append(replay)
                assert replay.entry.graph is not None
                calls.append(replay.entry.graph.replay)
                env[node] = replay.entry.outputs
            elif node.op == "call_function" and node.target is operator.getitem:
                source, index = node.args
                env[node] = env[source][index]  # type: ignore[index]
            elif node.op == "call_function" and isinstance(node.target, LayerAttention):
                args = [env[arg] for arg in node.args]  # type: ignore[index]
                if node.kwargs or not all(isinstance(a, torch.Tensor) for a in args):
                    raise NotRecordable(
                        f"{node.name} reads something other than the pieces' static outputs"
                    )
                calls.append(_AttentionCall(node.target, args))
                attention = True
            elif node.op == "output":
                outputs = [
                    env.get(a) for a in tree_leaves(node.args) if isinstance(a, torch.fx.Node)
                ]
            else:
                raise NotRecordable(
                    f"the split graph's {node.op} {node.target} runs between pieces"
                )
    if not any(o is hidden for o in tree_leaves(outputs)):
        raise NotRecordable("the model's output is not a graph's static output as it is")
    caches = [
        (layer, layer.kv_cache) for layer in model.modules() if hasattr(layer, "attn_backend")
    ]
    return RecordedStep(
        graphs,
        calls,
        hidden,
        attention=attention,
        entry=entry,
        compiled=compiled,
        replays=replays,
        caches=caches,
    )


class _Input:
    """A graph input of the split graph: nothing a recorded call may read."""

    def __init__(self, name: str) -> None:
        self.name = name


def _replay_of(wrapper: StaticGraphWrapper, size: int) -> _Replay:
    entry = wrapper.entries.get(size)
    if entry is None or entry.graph is None or not entry.replay_only:
        raise NotReady(f"{wrapper.name} has no checked graph of size {size} yet")
    return _Replay(wrapper, size, entry)


class _AttentionCall:
    """A layer's attention on the static tensors ``args`` (reading the step's metadata
    from the forward context, as between pieces)."""

    __slots__ = ("args", "attention")

    def __init__(self, attention: Any, args: list[torch.Tensor]) -> None:
        self.attention = attention
        self.args = tuple(args)

    def __call__(self) -> None:
        self.attention.run(*self.args)

    def bind(self, metadata: Any) -> Callable[[], None]:
        """The same call bound to ``metadata`` by the layer's backend."""
        return self.attention.bind(*self.args, metadata)
