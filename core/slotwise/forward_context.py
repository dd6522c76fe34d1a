"""The forward context: per-step state that ops inside a compiled model read.

Attention ops are opaque to the compiler, so they cannot take metadata as traced
inputs; they read it from here instead.  The static-graph wrappers read the step's
graph mode and batch size from here too.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from slotwise.graph_mode import GraphMode


@dataclass(frozen=True)
class BatchDescriptor:
    """What a static graph is keyed on: the (padded) token count of the step.

    ``uniform_decode`` marks batches where every request decodes one token, the
    case FULL graphs are captured for under FULL_AND_PIECEWISE.
    """

    num_tokens: int
    uniform_decode: bool = False


@dataclass
class ForwardContext:
    attn_metadata: Any = None
    #: The step's graph mode (NONE, PIECEWISE or FULL), decided once by the model's
    #: ``GraphDispatcher`` (``GraphDispatcher.step`` sets it for callers that run a model
    #: themselves); each static-graph wrapper acts only in steps of its own mode.  None
    #: is NONE: no graphs.
    graph_mode: GraphMode | None = None
    batch_descriptor: BatchDescriptor | None = None
    #: Free-form per-step values for plugins (e.g. a vendor's stream handle).
    extras: dict[str, Any] = field(default_factory=dict)


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "slotwise_forward_context", default=None
)


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: Any = None,
    *,
    graph_mode: GraphMode | str | None = None,
    batch_descriptor: BatchDescriptor | None = None,
    **extras: Any,
) -> Iterator[ForwardContext]:
    """Make ``attn_metadata`` and the runtime graph mode visible to one forward step."""
    if graph_mode is not None:
        graph_mode = GraphMode.parse(graph_mode)
        if not graph_mode.is_runtime_mode:
            raise ValueError(
                f"graph_mode={graph_mode.name} is a configuration, not a runtime mode; "
                f"use one of {', '.join(m.name for m in GraphMode.runtime_modes())}"
            )
    context = ForwardContext(attn_metadata, graph_mode, batch_descriptor, extras)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def get_forward_context() -> ForwardContext:
    """The active context; an error naming the fix when there is none."""
    context = _current.get()
    if context is None:
        raise RuntimeError(
            "no forward context is set: wrap the model call in "
            "`with slotwise.forward_context.set_forward_context(attn_metadata): ...`"
        )
    return context


def try_get_forward_context() -> ForwardContext | None:
    return _current.get()
