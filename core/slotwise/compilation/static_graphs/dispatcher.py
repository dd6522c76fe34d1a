"""``GraphDispatcher``: the one place a step's static-graph treatment is decided.

Built once per model from its settled config (``graph_modes.settle_graph_mode``), the
platform and the model's attention backends, it answers per step which graphs act
(NONE, PIECEWISE or FULL), the size the step is padded to and how its attention
metadata is laid out, and lists what to capture.  The ``ModelRunner`` asks it and
carries the answer in the forward context; the static-graph wrappers only compare that
mode with their own, and a forward context without a mode runs no graphs.

The semantics are vLLM's ``CudagraphDispatcher``: a step is padded to the next capture
size and runs without graphs above the largest; FULL_AND_PIECEWISE runs uniform-decode
steps as one FULL graph and every other step as PIECEWISE pieces.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slotwise.compilation.config import CompilationConfig, GraphMode
from slotwise.compilation.static_graphs.graph_modes import (
    attention_backends_of,
    require_graph_mode,
)
from slotwise.forward_context import BatchDescriptor, set_forward_context

if TYPE_CHECKING:
    import torch

    from slotwise.platforms import Platform


class MetadataLayout(enum.Enum):
    """How a step's attention metadata reaches the model."""

    #: As the caller built it: no FULL graph reads it.
    AS_BUILT = "as_built"
    #: Copied into static buffers as a batch of one-token decodes
    #: (``StaticAttentionMetadata.uniform_decode``), the FULL graphs of FULL_AND_PIECEWISE.
    UNIFORM_DECODE = "uniform_decode"
    #: Copied into static buffers as any batch (``StaticAttentionMetadata.general``),
    #: the FULL graphs of FULL.
    GENERAL = "general"


@dataclass(frozen=True)
class StepGraphs:
    """What ``GraphDispatcher.dispatch`` decided for one step."""

    #: The runtime mode: NONE, PIECEWISE or FULL.
    mode: GraphMode
    #: The tokens the step runs with: the next capture size, or the step's own count
    #: where it runs without graphs.
    padded_size: int
    metadata_layout: MetadataLayout
    uniform_decode: bool

    @property
    def batch_descriptor(self) -> BatchDescriptor:
        return BatchDescriptor(num_tokens=self.padded_size, uniform_decode=self.uniform_decode)


@dataclass(frozen=True)
class CaptureCase:
    """One graph set to capture: steps of ``size`` tokens, as ``uniform_decode`` batches,
    run in ``mode``."""

    size: int
    mode: GraphMode
    uniform_decode: bool


class GraphDispatcher:
    """Decides the graphs of every step of one model (see the module docstring).

    ``config``: the model's settled compilation config (None: an uncompiled model,
    which runs without graphs).  Raises ``ConfigError`` when an attention backend
    cannot be captured the way the config's mode needs (``require_graph_mode``).
    """

    def __init__(
        self,
        config: CompilationConfig | None,
        platform: Platform,
        attention_backends: Sequence[type] = (),
    ) -> None:
        mode = GraphMode.NONE if config is None or config.graph_mode is None else config.graph_mode
        if mode != GraphMode.NONE:
            for backend in dict.fromkeys(attention_backends):
                require_graph_mode(mode, platform, backend)
        self.graph_mode = mode
        self.capture_sizes: list[int] = (
            []
            if config is None or mode == GraphMode.NONE
            else sorted(set(config.capture_sizes or []))
        )

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> GraphDispatcher:
        """The dispatcher of ``model``: its first compiled module's config and platform,
        its attention backends; without a compiled module, one that never uses graphs."""
        from slotwise.compilation.compiled_modules import compiled_forward_of
        from slotwise.platforms import get_current_platform

        compiled = next(filter(None, map(compiled_forward_of, model.modules())), None)
        if compiled is None:
            return cls(None, get_current_platform())
        return cls(compiled.config, compiled.platform, attention_backends_of(model))

    def dispatch(self, num_tokens: int, uniform_decode: bool = False) -> StepGraphs:
        """The graphs of a step of ``num_tokens`` tokens (``uniform_decode``: every
        request decodes one token)."""
        index = bisect.bisect_left(self.capture_sizes, num_tokens)
        if index == len(self.capture_sizes):
            return StepGraphs(GraphMode.NONE, num_tokens, MetadataLayout.AS_BUILT, uniform_decode)
        padded = self.capture_sizes[index]
        if self.graph_mode == GraphMode.FULL:
            return StepGraphs(GraphMode.FULL, padded, MetadataLayout.GENERAL, uniform_decode)
        if self.graph_mode == GraphMode.FULL_AND_PIECEWISE and uniform_decode:
            return StepGraphs(GraphMode.FULL, padded, MetadataLayout.UNIFORM_DECODE, True)
        return StepGraphs(GraphMode.PIECEWISE, padded, MetadataLayout.AS_BUILT, uniform_decode)

    def capture_plan(self) -> list[CaptureCase]:
        """Every graph set to capture, largest size first (later, smaller graphs then fit
        in the memory the pool already holds): per size the FULL graph and, under
        FULL_AND_PIECEWISE, the pieces' graphs too."""
        shapes = {
            GraphMode.NONE: (),
            GraphMode.PIECEWISE: (False,),
            GraphMode.FULL: (False,),
            GraphMode.FULL_AND_PIECEWISE: (True, False),
        }[self.graph_mode]
        return [
            CaptureCase(size, self.dispatch(size, uniform).mode, uniform)
            for size in reversed(self.capture_sizes)
            for uniform in shapes
        ]

    @contextlib.contextmanager
    def step(
        self, num_tokens: int, *, uniform_decode: bool = False, attn_metadata: Any = None
    ) -> Iterator[StepGraphs]:
        """A forward context carrying the step's graphs, for callers that run the model
        themselves (tests, the conformance kit); they pass inputs of ``padded_size``."""
        graphs = self.dispatch(num_tokens, uniform_decode)
        with set_forward_context(
            attn_metadata, graph_mode=graphs.mode, batch_descriptor=graphs.batch_descriptor
        ):
            yield graphs
